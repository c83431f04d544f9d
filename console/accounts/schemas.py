"""API shapes for tokens, audit entries and the current user."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Field, Schema

from console.schemas import StrictIn, UtcDatetime


class TokenIn(StrictIn):
    name: str = Field(..., min_length=1, max_length=100)
    scope: Literal["read", "write"] = "read"
    expires_at: UtcDatetime | None = None
    username: str | None = Field(None, description="admins only: create for another user")
    allowed_models: list[str] = Field(
        default_factory=list,
        max_length=50,
        description="served model names the token may call through the gateway (/v1); empty: all",
    )


class TokenOut(Schema):
    id: int
    name: str
    user: str = Field(..., alias="user.username")
    hint: str
    scope: str
    state: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None
    revoked_at: datetime | None
    allowed_models: list[str]


class TokenCreatedOut(TokenOut):
    token: str = Field(..., description="the token value; shown this once, never stored")


class AuditOut(Schema):
    id: int
    time: datetime
    actor: str
    via: str
    remote_addr: str | None
    action: str
    object_type: str
    object_id: str
    object_repr: str
    message: str
    before: dict | None
    after: dict | None


class AuditFilters(Schema):
    action: str | None = None
    actor: str | None = None
    object_type: str | None = None
    object_id: str | None = None
    since: UtcDatetime | None = None


class MeOut(Schema):
    username: str
    role: str | None
    via: str
