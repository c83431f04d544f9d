"""Reading gateway usage (who may see what) and what the gateway can route to now."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import QuerySet, Sum
from django.utils import timezone

from console.accounts.models import ApiToken, Role
from console.accounts.services import Actor, check_role, check_write, has_role, record
from console.errors import Invalid, NotFound

from . import limits, usage
from .models import RateLimit, Usage


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


# --- rate limits ------------------------------------------------------------------------------
def rate_limits() -> QuerySet[RateLimit]:
    return RateLimit.objects.select_related("token", "token__user")


def set_rate_limit(
    *,
    actor: Actor,
    token_id: int | None,
    model: str = "",
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
    concurrent: int | None = None,
) -> RateLimit:
    """Create or change the limit for (token, model): admins only, one audit entry. A token
    given must exist and not be revoked; a model need not be served yet."""
    check_role(actor, Role.ADMIN)
    check_write(actor)
    model = model.strip()
    if token_id is not None and not ApiToken.objects.filter(pk=token_id).exists():
        raise Invalid(f"no API token has id {token_id}", field="token_id")
    values = {
        "requests_per_minute": requests_per_minute,
        "tokens_per_minute": tokens_per_minute,
        "concurrent": concurrent,
    }
    for name, value in values.items():
        if value is not None and value < 1:
            raise Invalid("a limit is at least 1 (leave it empty for no limit)", field=name)
    if all(v is None for v in values.values()):
        raise Invalid(
            "set at least one of requests_per_minute, tokens_per_minute, concurrent "
            "(to remove a limit, delete it)",
            field="requests_per_minute",
        )
    with transaction.atomic():
        row = RateLimit.objects.select_for_update().filter(token_id=token_id, model=model).first()
        before = row.as_dict() if row else None
        if row is None:
            row = RateLimit(token_id=token_id, model=model)
        for name, value in values.items():
            setattr(row, name, value)
        row.save()
        record(
            actor=actor,
            action="gateway.limit.set",
            obj=row,
            before=before,
            after=row.as_dict(),
        )
        transaction.on_commit(limits.bump_version)
    return row


def delete_rate_limit(*, actor: Actor, limit_id: int) -> None:
    check_role(actor, Role.ADMIN)
    check_write(actor)
    with transaction.atomic():
        row = RateLimit.objects.select_for_update().filter(pk=limit_id).first()
        if row is None:
            raise NotFound(f"no rate limit has id {limit_id}")
        record(actor=actor, action="gateway.limit.delete", obj=row, before=row.as_dict())
        row.delete()
        transaction.on_commit(limits.bump_version)
