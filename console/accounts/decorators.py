"""View decorators: the role a page or action needs."""

from __future__ import annotations

from functools import wraps

from django.core.exceptions import PermissionDenied

from console.accounts.services import has_role


def role_required(role: str):
    """403 unless the signed-in user holds `role` (LoginRequiredMiddleware handles anonymous)."""

    def decorate(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not has_role(request.user, role):
                raise PermissionDenied(f"this needs the {role} role")
            return view(request, *args, **kwargs)

        wrapper.required_role = role
        return wrapper

    return decorate
