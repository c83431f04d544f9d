"""`/api/v1/gateway/…`: usage per token and model, and what the gateway serves."""

from datetime import date

from ninja import Field, Query, Router, Schema

from console.accounts.services import actor_from_request

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
