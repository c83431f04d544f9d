"""Roles, tokens and audit: every write here records who did it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from django.db import models, transaction
from django.utils import timezone

from console.accounts.models import (
    ROLE_PERMISSIONS,
    TOKEN_PREFIX,
    AccountState,
    ApiToken,
    AuditEntry,
    Role,
    TokenScope,
    hash_token,
)
from console.errors import Forbidden, Invalid, NotFound

ROLE_ORDER = [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
ROLE_PERM = {
    Role.VIEWER: "view_console",
    Role.OPERATOR: "operate_console",
    Role.ADMIN: "administer_console",
}
LAST_USED_RESOLUTION = timedelta(seconds=60)  # coalesce token "last used" writes


@dataclass(frozen=True)
class Actor:
    """Who is acting: a user (web or token) or the system itself."""

    user: Any | None
    name: str
    via: str = "web"
    remote_addr: str | None = None
    token: ApiToken | None = None

    @classmethod
    def system(cls, name: str = "system") -> Actor:
        return cls(user=None, name=name, via="system")


def actor_from_request(request) -> Actor:
    token = getattr(request, "api_token", None)
    user = request.user if request.user.is_authenticated else None
    name = user.get_username() if user else "anonymous"
    via = "token" if token else ("api" if request.path.startswith("/api/") else "web")
    if token:
        name = f"{name} (token {token.name})"
    return Actor(user=user, name=name, via=via, remote_addr=client_addr(request), token=token)


def client_addr(request) -> str | None:
    # REMOTE_ADDR only: X-Forwarded-For is client-controlled unless a trusted proxy rewrites it.
    return request.META.get("REMOTE_ADDR") or None


def record(
    *,
    actor: Actor,
    action: str,
    obj: models.Model | None = None,
    message: str = "",
    before: dict | None = None,
    after: dict | None = None,
) -> AuditEntry:
    """Append one audit entry. Call inside the transaction that makes the change."""
    return AuditEntry.objects.create(
        user=actor.user,
        actor=actor.name[:150],
        via=actor.via,
        remote_addr=actor.remote_addr,
        action=action,
        object_type=obj._meta.label_lower if obj is not None else "",
        object_id=str(obj.pk) if obj is not None else "",
        object_repr=str(obj)[:200] if obj is not None else "",
        message=message[:500],
        before=before,
        after=after,
    )


# --- roles ----------------------------------------------------------------------------------
def ensure_roles() -> None:
    """Create the viewer/operator/admin groups with their permissions (idempotent)."""
    for role, codenames in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        perms = Permission.objects.filter(
            content_type__app_label="accounts", codename__in=codenames
        )
        group.permissions.set(perms)


def has_role(user: AbstractBaseUser | None, role: str) -> bool:
    """True when the user holds `role` or a higher one (superusers hold every role)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    return user.has_perm(f"accounts.{ROLE_PERM[Role(role)]}")


def user_role(user: AbstractBaseUser | None) -> str | None:
    """The highest role the user holds, or None."""
    for role in reversed(ROLE_ORDER):
        if has_role(user, role):
            return str(role)
    return None


def set_role(*, actor: Actor, user, role: str | None) -> None:
    """Put `user` in exactly one role group (or none)."""
    before = user_role(user)
    with transaction.atomic():
        user.groups.remove(*Group.objects.filter(name__in=[str(r) for r in ROLE_ORDER]))
        if role:
            user.groups.add(Group.objects.get(name=Role(role)))
        record(
            actor=actor,
            action="user.set_role",
            obj=user,
            before={"role": before},
            after={"role": role},
        )
    for cache in ("_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        user.__dict__.pop(cache, None)


def check_role(actor: Actor, role: str) -> None:
    """Raise Forbidden unless the actor holds `role` (or a higher one)."""
    if not has_role(actor.user, role):
        raise Forbidden(f"this action needs the {role} role")


def check_write(actor: Actor) -> None:
    """Raise Forbidden when the actor acts through a read-only token."""
    if actor.token is not None and actor.token.scope != TokenScope.WRITE:
        raise Forbidden("this token is read-only")


# --- passwords ------------------------------------------------------------------------------
def require_password_change(*, actor: Actor, user) -> None:
    """Make `user` change the password at the next sign-in (a generated one; idempotent)."""
    with transaction.atomic():
        AccountState.objects.update_or_create(user=user, defaults={"must_change_password": True})
        record(actor=actor, action="user.require_password_change", obj=user)


def must_change_password(user) -> bool:
    """True while `user` still has a password that must be changed (one query)."""
    if user is None or not user.is_authenticated:
        return False
    return AccountState.objects.filter(user=user, must_change_password=True).exists()


def change_password(*, actor: Actor, user, new_password: str) -> None:
    """Set `user`'s password (already validated by the form) and lift a pending
    must-change. Audited without the password; the caller keeps the session alive
    (update_session_auth_hash): every other session of the user ends."""
    with transaction.atomic():
        user.set_password(new_password)
        user.save(update_fields=["password"])
        was_required = AccountState.objects.filter(user=user, must_change_password=True).update(
            must_change_password=False
        )
        record(
            actor=actor,
            action="user.password_change",
            obj=user,
            message="first sign-in: the generated password was replaced" if was_required else "",
        )


# --- tokens ---------------------------------------------------------------------------------
def create_token(
    *,
    actor: Actor,
    name: str,
    scope: str = TokenScope.READ,
    expires_at: datetime | None = None,
    user=None,
    allowed_models: list[str] | None = None,
) -> tuple[ApiToken, str]:
    """Create a token for `user` (default: the actor). Returns the row and the raw value,
    which is never stored and cannot be shown again.

    When the actor acts through a token, the new token is its child and stays within it
    (`_within_parent`): scope no wider, models a subset (none named: the parent's), expiry
    no later (none given: the parent's); revoking the parent revokes the child."""
    owner = user or actor.user
    if owner != actor.user:
        check_role(actor, Role.ADMIN)
    if not name.strip():
        raise Invalid("a token needs a name", field="name")
    if expires_at is not None and expires_at <= timezone.now():
        raise Invalid("expiry must be in the future", field="expires_at")
    models_ = sorted({m.strip() for m in (allowed_models or []) if m.strip()})
    if any(len(m) > 200 or not m.isprintable() for m in models_):
        raise Invalid(
            "model names are printable and at most 200 characters", field="allowed_models"
        )
    raw = ApiToken.generate()
    with transaction.atomic():
        parent = None
        if actor.token is not None:
            # Locked and re-read: a parent revoked meanwhile must not leave a live child.
            parent = ApiToken.objects.select_for_update().get(pk=actor.token.pk)
            if not parent.is_active():
                raise Forbidden("this token is no longer active")
            expires_at, models_ = _within_parent(parent, scope, expires_at, models_)
        token = ApiToken.objects.create(
            user=owner,
            name=name.strip(),
            key_hash=hash_token(raw),
            hint=raw[:10],
            scope=TokenScope(scope),
            expires_at=expires_at,
            allowed_models=models_,
            parent=parent,
        )
        record(
            actor=actor,
            action="token.create",
            obj=token,
            after={
                "scope": token.scope,
                "user": owner.get_username(),
                "allowed_models": token.allowed_models,
                "expires_at": expires_at.isoformat() if expires_at else None,
                "parent": parent.pk if parent else None,
            },
        )
    return token, raw


def _within_parent(
    parent: ApiToken, scope: str, expires_at: datetime | None, models_: list[str]
) -> tuple[datetime | None, list[str]]:
    """The child's expiry and models, clamped to the parent's; Forbidden (naming the field)
    for a request that asks for more than the parent holds."""
    if scope == TokenScope.WRITE and parent.scope != TokenScope.WRITE:
        raise Forbidden("a read-only token cannot create a write token", field="scope")
    if parent.allowed_models:
        outside = sorted(set(models_) - set(parent.allowed_models))
        if outside:
            raise Forbidden(f"this token may not use {', '.join(outside)}", field="allowed_models")
        models_ = models_ or list(parent.allowed_models)
    if parent.expires_at is not None:
        if expires_at is None:
            expires_at = parent.expires_at
        elif expires_at > parent.expires_at:
            raise Forbidden("a token cannot outlive the token that creates it", field="expires_at")
    return expires_at, models_


def revoke_token(*, actor: Actor, token_id: int) -> ApiToken:
    """Revoke a token and every token descending from it (idempotent; each revocation is
    audited, the descendants' as `token.revoke` with the cascade named). Owners revoke their
    own; admins anyone's."""
    token = ApiToken.objects.filter(pk=token_id).select_related("user").first()
    if token is None or (token.user != actor.user and not has_role(actor.user, Role.ADMIN)):
        raise NotFound("no such token")
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().select_related("user").get(pk=token.pk)
        now = timezone.now()
        if token.revoked_at is None:
            token.revoked_at = now
            token.save(update_fields=["revoked_at"])
            record(actor=actor, action="token.revoke", obj=token)
        frontier = [token.pk]
        while frontier:
            children = list(ApiToken.objects.select_for_update().filter(parent_id__in=frontier))
            for child in children:
                if child.revoked_at is None:
                    child.revoked_at = now
                    child.save(update_fields=["revoked_at"])
                    record(
                        actor=actor,
                        action="token.revoke",
                        obj=child,
                        message=f"cascade: its parent token {child.parent_id} was revoked",
                    )
            frontier = [c.pk for c in children]
    return token


def authenticate_token(raw: str) -> ApiToken | None:
    """The active token for a raw value, touching last_used_at at most once a minute."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = ApiToken.objects.filter(key_hash=hash_token(raw)).select_related("user").first()
    if token is None or not token.is_active() or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def tokens_visible_to(user) -> models.QuerySet[ApiToken]:
    qs = ApiToken.objects.select_related("user")
    return qs if has_role(user, Role.ADMIN) else qs.filter(user=user)
