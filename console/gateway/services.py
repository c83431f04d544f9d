"""Reading gateway usage (who may see what) and what the gateway can route to now."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import QuerySet, Sum
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import has_role

from . import usage
from .models import Usage


def usage_visible_to(
    user, *, days: int = 7, model: str = "", token_id: int | None = None
) -> QuerySet[Usage]:
    """Usage rows of the last `days` days (admins: everyone's; others: their own tokens')."""
    usage.flush()  # fold in what Redis counted since the last beat
    since = timezone.localdate() - timedelta(days=max(days, 1) - 1)
    qs = Usage.objects.filter(day__gte=since).select_related("token", "user")
    if not has_role(user, Role.ADMIN):
        qs = qs.filter(user=user)
    if model:
        qs = qs.filter(model=model)
    if token_id is not None:
        qs = qs.filter(token_id=token_id)
    return qs


def totals(qs: QuerySet[Usage]) -> dict[str, int]:
    agg = qs.aggregate(*(Sum(c) for c in usage.COUNTERS))
    return {c: agg[f"{c}__sum"] or 0 for c in usage.COUNTERS}


def served_models() -> list[dict]:
    """Every served model name with its deployments' ready / wanted replica counts."""
    from console.deployments.models import Deployment, ReplicaState

    out: dict[str, dict] = {}
    for dep in Deployment.objects.prefetch_related("replica_set"):
        row = out.setdefault(
            dep.served_model_name,
            {"model": dep.served_model_name, "deployments": [], "ready": 0, "wanted": 0},
        )
        row["deployments"].append(dep.name)
        row["ready"] += sum(r.state == ReplicaState.READY for r in dep.replica_set.all())
        row["wanted"] += dep.replicas if dep.desired_state == "running" else 0
    return sorted(out.values(), key=lambda r: r["model"])
