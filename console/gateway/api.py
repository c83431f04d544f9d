"""`/api/v1/gateway/…`: usage per token and model, and what the gateway serves."""

from datetime import date

from ninja import Field, Query, Router, Schema, Status

from console.accounts.models import Role
from console.accounts.services import actor_from_request, has_role
from console.schemas import StrictIn

from . import services

router = Router(tags=["gateway"])


class UsageOut(Schema):
    day: date
    token_id: int | None
    token_name: str
    user: str | None = Field(None, alias="user.username")
    model: str
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    limited: int


class UsageReport(Schema):
    days: int
    totals: dict[str, int]
    rows: list[UsageOut]


class ServedModelOut(Schema):
    model: str
    deployments: list[str]
    ready: int
    wanted: int


@router.get("/gateway/usage", response=UsageReport)
def gateway_usage(
    request,
    days: int = Query(7, ge=1, le=366),
    model: str = Query("", max_length=200),
    token_id: int | None = None,
):
    """Requests and tokens through `/v1` per day, token and model (yours; admins: all)."""
    user = actor_from_request(request).user
    qs = services.usage_visible_to(user, days=days, model=model, token_id=token_id)
    return {"days": days, "totals": services.totals(qs), "rows": list(qs)}


@router.get("/gateway/models", response=list[ServedModelOut])
def gateway_models(request):
    """Served model names and how many replicas are ready to take their requests."""
    return services.served_models()


class RateLimitIn(StrictIn):
    """A limit on gateway traffic. `token_id` and `model` say whom it binds: both, that token
    on that model; token only, that token on every model; model only, every token together on
    that model; neither, each token that has no token-only limit of its own. An empty number
    is no limit of that kind."""

    token_id: int | None = None
    model: str = Field("", max_length=200)
    requests_per_minute: int | None = Field(None, ge=1, le=10_000_000)
    tokens_per_minute: int | None = Field(None, ge=1, le=10_000_000_000)
    concurrent: int | None = Field(None, ge=1, le=1_000_000)


class RateLimitOut(Schema):
    id: int
    token_id: int | None
    token_name: str | None = Field(None, alias="token.name")
    model: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    concurrent: int | None


@router.get("/gateway/limits", response=list[RateLimitOut])
def gateway_limits(request):
    """The rate limits (admins: all; others: those that can bind their own tokens)."""
    user = actor_from_request(request).user
    qs = services.rate_limits()
    if not has_role(user, Role.ADMIN):
        qs = qs.filter(token__isnull=True) | qs.filter(token__user=user)
    return list(qs)


@router.put("/gateway/limits", response=RateLimitOut)
def gateway_set_limit(request, payload: RateLimitIn):
    """Create or replace the limit for (token_id, model). Admins only."""
    return services.set_rate_limit(actor=actor_from_request(request), **payload.dict())


@router.delete("/gateway/limits/{limit_id}", response={204: None})
def gateway_delete_limit(request, limit_id: int):
    """Remove a limit. Admins only."""
    services.delete_rate_limit(actor=actor_from_request(request), limit_id=limit_id)
    return Status(204, None)
