"""The gateway page: the endpoint, what it serves now, its rate limits, and usage per token
and model."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.accounts.decorators import role_required
from console.accounts.models import ApiToken, Role
from console.accounts.services import actor_from_request, has_role
from console.errors import DomainError

from . import services

LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "concurrent")


@role_required("viewer")
def gateway(request):
    days = 7
    qs = services.usage_visible_to(request.user, days=days)
    admin = has_role(request.user, Role.ADMIN)
    limits = services.rate_limits()
    if not admin:
        limits = limits.filter(token__isnull=True) | limits.filter(token__user=request.user)
    context = {
        "endpoint": request.build_absolute_uri("/v1"),
        "models": services.served_models(),
        "rows": list(qs),
        "totals": services.totals(qs),
        "days": days,
        "limits": list(limits),
        "can_set_limits": admin,
        "limit_tokens": (
            ApiToken.objects.filter(revoked_at__isnull=True).select_related("user") if admin else ()
        ),
    }
    return render(request, "gateway/index.html", context)


def _number(request, name: str) -> int | None:
    raw = request.POST.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise DomainError(f"{name.replace('_', ' ')} must be a whole number", field=name)
    return int(raw)


@require_POST
@role_required("admin")
def limit_set(request):
    try:
        token = request.POST.get("token", "").strip()
        if token and not token.isdigit():
            raise DomainError("choose a token from the list", field="token")
        row = services.set_rate_limit(
            actor=actor_from_request(request),
            token_id=int(token) if token else None,
            model=request.POST.get("model", "")[:200],
            **{name: _number(request, name) for name in LIMIT_FIELDS},
        )
        messages.success(request, f"limit set: {row}")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("gateway")


@require_POST
@role_required("admin")
def limit_delete(request, limit_id: int):
    try:
        services.delete_rate_limit(actor=actor_from_request(request), limit_id=limit_id)
        messages.success(request, "limit removed")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("gateway")
