"""REST routes for the current user, API tokens and the audit log."""

from django.contrib.auth import get_user_model
from ninja import Query, Router, Status
from ninja.pagination import paginate

from console.accounts import services
from console.accounts.models import AuditEntry, Role
from console.accounts.schemas import (
    AuditFilters,
    AuditOut,
    MeOut,
    TokenCreatedOut,
    TokenIn,
    TokenOut,
)
from console.errors import Invalid
from console.pagination import LimitOffsetPagination

router = Router(tags=["accounts"])


@router.get("/me", response=MeOut)
def me(request):
    actor = services.actor_from_request(request)
    return {
        "username": request.user.get_username(),
        "role": services.user_role(request.user),
        "via": actor.via,
    }


@router.get("/tokens", response=list[TokenOut])
@paginate(LimitOffsetPagination)
def list_tokens(request):
    return services.tokens_visible_to(request.user)


@router.post("/tokens", response={201: TokenCreatedOut})
def create_token(request, payload: TokenIn):
    actor = services.actor_from_request(request)
    owner = None
    if payload.username:
        owner = get_user_model().objects.filter(username=payload.username).first()
        if owner is None:
            raise Invalid(f"no user named {payload.username!r}", field="username")
    token, raw = services.create_token(
        actor=actor,
        name=payload.name,
        scope=payload.scope,
        expires_at=payload.expires_at,
        user=owner,
        allowed_models=payload.allowed_models,
    )
    token.token = raw
    return Status(201, token)


@router.post("/tokens/{token_id}/revoke", response=TokenOut)
def revoke_token(request, token_id: int):
    return services.revoke_token(actor=services.actor_from_request(request), token_id=token_id)


@router.get("/audit", response=list[AuditOut])
@paginate(LimitOffsetPagination)
def list_audit(request, filters: Query[AuditFilters]):
    services.check_role(services.actor_from_request(request), Role.OPERATOR)
    qs = AuditEntry.objects.all()
    for field in ("action", "actor", "object_type", "object_id"):
        value = getattr(filters, field)
        if value:
            qs = qs.filter(**{field: value})
    if filters.since:
        qs = qs.filter(time__gte=filters.since)
    return qs
