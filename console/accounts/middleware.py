"""Every page needs a signed-in user; the API and /metrics answer 401 themselves. A user whose
password must be changed (the generated first admin) is sent to change it first."""

from __future__ import annotations

from django.contrib.auth.middleware import LoginRequiredMiddleware as _Base
from django.contrib.auth.views import redirect_to_login
from django.http import JsonResponse
from django.urls import reverse
from django.utils.deprecation import MiddlewareMixin
from django_htmx.http import HttpResponseClientRedirect

from console.accounts.services import must_change_password

# Paths that authenticate on their own (bearer tokens) and must answer 401, not a redirect.
SELF_AUTHENTICATING = ("/api/v1/", "/metrics", "/v1/")
# The flag, read once per session (set at sign-in, cleared by the password change).
MUST_CHANGE_KEY = "npc_must_change_password"
# What a user who must change the password may still reach.
PASSWORD_CHANGE_EXEMPT = {"password-change", "logout"}


class LoginRequiredMiddleware(_Base):
    def process_view(self, request, view_func, view_args, view_kwargs):
        if request.path.startswith(SELF_AUTHENTICATING):
            return None
        return super().process_view(request, view_func, view_args, view_kwargs)


def note_password_state(sender, request, user, **kwargs) -> None:
    """user_logged_in receiver: remember in the session whether the password must change."""
    if request is not None and hasattr(request, "session"):
        request.session[MUST_CHANGE_KEY] = must_change_password(user)


class PasswordChangeRequiredMiddleware(MiddlewareMixin):
    """Until a flagged user changes the password, pages redirect to the change form (htmx
    requests through HX-Redirect) and session API calls get 403. Bearer tokens are not
    affected: a token is its own credential, minted before or after the change."""

    def process_view(self, request, view_func, view_args, view_kwargs):
        user = request.user
        if not user.is_authenticated or request.path.startswith(("/metrics", "/v1/")):
            return None
        flag = request.session.get(MUST_CHANGE_KEY)
        if flag is None:  # a session from before the flag existed: look once
            flag = request.session[MUST_CHANGE_KEY] = must_change_password(user)
        match = request.resolver_match
        if not flag or (match is not None and match.url_name in PASSWORD_CHANGE_EXEMPT):
            return None
        if request.path.startswith("/api/"):
            if request.META.get("HTTP_AUTHORIZATION"):
                return None
            message = "change your password first: it was generated (sign in on the web page)"
            return JsonResponse({"message": message, "field": None}, status=403)
        url = reverse("password-change")
        if getattr(request, "htmx", False):
            return HttpResponseClientRedirect(url)
        return redirect_to_login(request.get_full_path(), url, "next")
