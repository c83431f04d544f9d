"""/metrics for Prometheus: authenticated by an API token of a user with the viewer role."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from console.accounts.models import Role
from console.accounts.services import authenticate_token, has_role
from console.telemetry.prometheus import CONTENT_TYPE, render_metrics


def _refuse(status: int, message: str) -> HttpResponse:
    resp = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        resp["WWW-Authenticate"] = 'Bearer realm="npu-console"'
    return resp


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """401 without an active `Authorization: Bearer npc_…` token, 403 when its user lacks the
    viewer role, else the exposition text. Reads Redis and two small queries; no writes
    except the token's last-used time (at most once a minute)."""
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    token = authenticate_token(raw.strip()) if scheme.lower() == "bearer" else None
    if token is None:
        return _refuse(401, "authentication required: Authorization: Bearer <API token>")
    if not has_role(token.user, Role.VIEWER):
        return _refuse(403, "this token's user needs the viewer role")
    return HttpResponse(render_metrics(), content_type=CONTENT_TYPE)
