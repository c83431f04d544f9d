"""The gateway page: the endpoint, what it serves now, and usage per token and model."""

from __future__ import annotations

from django.shortcuts import render

from console.accounts.decorators import role_required

from . import services


@role_required("viewer")
def gateway(request):
    days = 7
    qs = services.usage_visible_to(request.user, days=days)
    context = {
        "endpoint": request.build_absolute_uri("/v1"),
        "models": services.served_models(),
        "rows": list(qs),
        "totals": services.totals(qs),
        "days": days,
    }
    return render(request, "gateway/index.html", context)
