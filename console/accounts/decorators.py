"""View decorators: the role a page or action needs.

A refusal raises PermissionDenied with the role named, and leaves the role on the request
(`request.required_role`) for templates/403.html, which shows it beside the user's own."""

from __future__ import annotations

from functools import wraps
from inspect import iscoroutinefunction

from asgiref.sync import sync_to_async
from django.core.exceptions import PermissionDenied

from console.accounts.services import has_role


def role_required(role: str):
    """403 unless the signed-in user holds `role` (LoginRequiredMiddleware handles anonymous)."""

    def decorate(view):
        if iscoroutinefunction(view):  # an async view: the user is loaded without blocking

            @wraps(view)
            async def async_wrapper(request, *args, **kwargs):
                user = await request.auser()
                if not await sync_to_async(has_role)(user, role):
                    request.required_role = role
                    raise PermissionDenied(f"this needs the {role} role")
                return await view(request, *args, **kwargs)

            async_wrapper.required_role = role
            return async_wrapper

        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not has_role(request.user, role):
                request.required_role = role
                raise PermissionDenied(f"this needs the {role} role")
            return view(request, *args, **kwargs)

        wrapper.required_role = role
        return wrapper

    return decorate
