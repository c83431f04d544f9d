"""Who is calling the gateway: an API token (`Authorization: Bearer npc_…`) of a user with
at least the viewer role. Lookups are cached for a few seconds so the request path costs no
database round trip in steady state; a revoked token stops working within CACHE_S. A token in
use is looked up again in the background in the second half of its entry's life (one lookup
at a time per token), so a steady client never waits for the database."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from console.accounts.models import Role, hash_token
from console.accounts.services import authenticate_token, has_role
from console.gateway import db

log = logging.getLogger("console.gateway")

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
        if hit[0] - now < CACHE_S / 2 and key not in _refreshing:
            _refreshing[key] = asyncio.get_running_loop().create_task(_look_up_again(key, raw))
        return hit[1]
    return await _look_up(key, raw)


async def _look_up(key: str, raw: str) -> Principal | None:
    principal = await db.read(lambda: _lookup(raw))
    if len(_cache) >= _MAX_ENTRIES:
        _cache.clear()
    _cache[key] = (time.monotonic() + CACHE_S, principal)
    return principal


async def _look_up_again(key: str, raw: str) -> None:
    """The background lookup: a failure leaves the entry to expire (the next request after
    that looks it up itself, and sees the error)."""
    try:
        await _look_up(key, raw)
    except Exception as exc:
        log.warning("token lookup failed: %s", exc)
    finally:
        _refreshing.pop(key, None)


_refreshing: dict[str, asyncio.Task] = {}


def forget() -> None:
    """Drop cached lookups (tests; a revocation that must bite at once)."""
    _cache.clear()
