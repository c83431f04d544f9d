"""Enrollment (bootstrap) tokens: created and revoked by admins.

An agent uses a token once per node to obtain that node's own credential; the token itself
never travels (the agent proves it holds it, console/inventory/identity.py). A token may be
limited to a number of enrollments and to node names matching a shell glob, and may expire.
Revoking it stops new enrollments only: enrolled nodes keep their credentials.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from console.accounts.models import Role, hash_token
from console.accounts.services import Actor, check_role, record
from console.errors import Invalid, NotFound
from console.inventory.models import EnrollmentToken

ENROLL_PREFIX = "npe_"
# DNS-label characters plus the glob's * ? and [...] classes (a leading ! negates a class)
_PATTERN_CHARS = re.compile(r"^[a-z0-9*?\[\]!-]+$")
_PATTERN_CLASS = re.compile(r"\[!?[a-z0-9-]+\]")


def create_enrollment_token(
    *,
    actor: Actor,
    name: str,
    expires_at: datetime | None = None,
    max_uses: int | None = None,
    node_pattern: str = "",
) -> tuple[EnrollmentToken, str]:
    """An admin creates a token for agents; returns the row and the raw value (shown once)."""
    check_role(actor, Role.ADMIN)
    return issue_enrollment_token(
        actor=actor,
        name=name,
        expires_at=expires_at,
        max_uses=max_uses,
        node_pattern=node_pattern,
    )


def issue_enrollment_token(
    *,
    actor: Actor,
    name: str,
    expires_at: datetime | None = None,
    max_uses: int | None = None,
    node_pattern: str = "",
) -> tuple[EnrollmentToken, str]:
    """Create an enrollment token without a role check: for trusted callers (`make run`).
    Raises Invalid (naming the field) for a blank name, a past expiry, `max_uses` below 1 or
    a node pattern that is not a glob of DNS-label characters."""
    if not name.strip():
        raise Invalid("an enrollment token needs a name", field="name")
    if expires_at is not None and expires_at <= timezone.now():
        raise Invalid("expiry must be in the future", field="expires_at")
    if max_uses is not None and (isinstance(max_uses, bool) or max_uses < 1):
        raise Invalid("max uses must be 1 or more (empty: unlimited)", field="max_uses")
    node_pattern = validate_node_pattern(node_pattern)
    raw = ENROLL_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = EnrollmentToken.objects.create(
            name=name.strip(),
            key_hash=hash_token(raw),
            hint=raw[:10],
            created_by=actor.user,
            expires_at=expires_at,
            max_uses=max_uses,
            node_pattern=node_pattern,
        )
        record(actor=actor, action="enrollment.create", obj=token, message=_limits(token))
    return token, raw


def validate_node_pattern(pattern: str) -> str:
    """The pattern stripped, or Invalid: lowercase DNS-label characters, `*`, `?` and
    `[...]` classes (node names are lowercase, and the match is case-sensitive)."""
    pattern = pattern.strip()
    if not pattern:
        return ""
    if len(pattern) > 100:
        raise Invalid("node pattern: at most 100 characters", field="node_pattern")
    bare = _PATTERN_CLASS.sub("", pattern)
    if not _PATTERN_CHARS.match(pattern) or any(c in bare for c in "[]!"):
        raise Invalid(
            "node pattern: a glob of lowercase letters, digits and '-' with * ? and [...], "
            "e.g. rack-b-* or kp-0[1-4]",
            field="node_pattern",
        )
    return pattern


def _limits(token: EnrollmentToken) -> str:
    parts = []
    if token.max_uses is not None:
        parts.append("single use" if token.max_uses == 1 else f"{token.max_uses} uses")
    if token.node_pattern:
        parts.append(f"nodes {token.node_pattern}")
    if token.expires_at is not None:
        parts.append(f"expires {token.expires_at.isoformat(timespec='minutes')}")
    return ", ".join(parts)


def revoke_enrollment_token(*, actor: Actor, token_id: int) -> EnrollmentToken:
    """Stop new enrollments with the token (idempotent). Nodes already enrolled with it keep
    their own credentials: cut one off by revoking its credential (identity.revoke_credential)."""
    check_role(actor, Role.ADMIN)
    token = EnrollmentToken.objects.filter(pk=token_id).first()
    if token is None:
        raise NotFound("no such enrollment token", field="token_id")
    if token.revoked_at is None:
        with transaction.atomic():
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            record(actor=actor, action="enrollment.revoke", obj=token)
    return token
