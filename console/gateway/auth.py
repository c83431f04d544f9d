"""Who is calling the gateway: an API token (`Authorization: Bearer npc_…`) of a user with
at least the viewer role. Lookups are cached for a few seconds so the request path costs no
database round trip in steady state; a revoked token stops working within CACHE_S."""

from __future__ import annotations

import time
from dataclasses import dataclass

from console.accounts.models import Role, hash_token
from console.accounts.services import authenticate_token, has_role
from console.gateway import db

CACHE_S = 5.0
_MAX_ENTRIES = 10_000


@dataclass(frozen=True)
class Principal:
    token_id: int
    token_name: str
    username: str
    allowed_models: tuple[str, ...]

    def may_use(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


_cache: dict[str, tuple[float, Principal | None]] = {}


def _lookup(raw: str) -> Principal | None:
    token = authenticate_token(raw)
    if token is None or not has_role(token.user, Role.VIEWER):
        return None
    return Principal(
        token_id=token.pk,
        token_name=token.name,
        username=token.user.get_username(),
        allowed_models=tuple(token.allowed_models or ()),
    )


async def authenticate(authorization: str | None) -> Principal | None:
    if not authorization or not authorization.lower().startswith("bearer "):
        return None
    raw = authorization[7:].strip()
    key = hash_token(raw)
    now = time.monotonic()
    hit = _cache.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    principal = await db.read(lambda: _lookup(raw))
    if len(_cache) >= _MAX_ENTRIES:
        _cache.clear()
    _cache[key] = (now + CACHE_S, principal)
    return principal


def forget() -> None:
    """Drop cached lookups (tests; a revocation that must bite at once)."""
    _cache.clear()
