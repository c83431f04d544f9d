"""Every page needs a signed-in user; the API and /metrics answer 401 themselves."""

from __future__ import annotations

from django.contrib.auth.middleware import LoginRequiredMiddleware as _Base

# Paths that authenticate on their own (bearer tokens) and must answer 401, not a redirect.
SELF_AUTHENTICATING = ("/api/v1/", "/metrics", "/v1/")


class LoginRequiredMiddleware(_Base):
    def process_view(self, request, view_func, view_args, view_kwargs):
        if request.path.startswith(SELF_AUTHENTICATING):
            return None
        return super().process_view(request, view_func, view_args, view_kwargs)
