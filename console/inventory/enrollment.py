"""Enrollment tokens: created by admins, checked on every heartbeat (cheaply)."""

from __future__ import annotations

import secrets
import time
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from console.accounts.models import Role, hash_token
from console.accounts.services import Actor, check_role, record
from console.errors import Invalid, NotFound
from console.inventory.models import EnrollmentToken

ENROLL_PREFIX = "npe_"
_CACHE_TTL_S = 15.0
_cache: dict[str, tuple[float, int | None, datetime | None]] = {}


def create_enrollment_token(
    *, actor: Actor, name: str, expires_at: datetime | None = None
) -> tuple[EnrollmentToken, str]:
    """An admin creates a token for agents; returns the row and the raw value (shown once)."""
    check_role(actor, Role.ADMIN)
    return issue_enrollment_token(actor=actor, name=name, expires_at=expires_at)


def issue_enrollment_token(
    *, actor: Actor, name: str, expires_at: datetime | None = None
) -> tuple[EnrollmentToken, str]:
    """Create an enrollment token without a role check: for trusted callers (`make run`)."""
    if not name.strip():
        raise Invalid("an enrollment token needs a name", field="name")
    if expires_at is not None and expires_at <= timezone.now():
        raise Invalid("expiry must be in the future", field="expires_at")
    raw = ENROLL_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = EnrollmentToken.objects.create(
            name=name.strip(),
            key_hash=hash_token(raw),
            hint=raw[:10],
            created_by=actor.user,
            expires_at=expires_at,
        )
        record(actor=actor, action="enrollment.create", obj=token)
    return token, raw


def revoke_enrollment_token(*, actor: Actor, token_id: int) -> EnrollmentToken:
    check_role(actor, Role.ADMIN)
    token = EnrollmentToken.objects.filter(pk=token_id).first()
    if token is None:
        raise NotFound("no such enrollment token", field="token_id")
    if token.revoked_at is None:
        with transaction.atomic():
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            record(actor=actor, action="enrollment.revoke", obj=token)
        _cache.clear()
    return token


def enrollment_token_id(raw: str, now: datetime | None = None) -> int | None:
    """The id of the active enrollment token `raw`, or None.

    Cached per process for a few seconds so heartbeats do not query the database each time;
    a revocation takes effect within that time everywhere.
    """
    digest = hash_token(raw)
    mono = time.monotonic()
    hit = _cache.get(digest)
    if hit is None or mono - hit[0] > _CACHE_TTL_S:
        row = (
            EnrollmentToken.objects.filter(key_hash=digest)
            .values_list("id", "expires_at", "revoked_at")
            .first()
        )
        token_id, expires_at = (row[0], row[1]) if row and row[2] is None else (None, None)
        hit = (mono, token_id, expires_at)
        _cache[digest] = hit
    _, token_id, expires_at = hit
    if token_id is None or (expires_at is not None and expires_at <= (now or timezone.now())):
        return None
    return token_id
