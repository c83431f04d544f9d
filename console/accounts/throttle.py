"""Sign-in rate limiting: failed attempts counted per user name + client address in Redis.

Guarantee: after `LOGIN_FAILURE_LIMIT` failed sign-ins for one user name from one address
within `LOGIN_FAILURE_WINDOW_S`, further attempts from there are refused with 429 (the
password is not even checked) until the window, which starts at the first failure, runs out.
The moment of lockout writes one audit entry. A successful sign-in clears the count.
If Redis cannot be reached, sign-in still works (logged): the limiter is a brake, not a gate.
"""

from __future__ import annotations

import hashlib
import logging

import redis
from django.conf import settings
from django.contrib.auth import get_user_model

from console.accounts.services import Actor, record
from console.hot import get_redis

log = logging.getLogger(__name__)


def _limit() -> int:
    return getattr(settings, "LOGIN_FAILURE_LIMIT", 5)


def _window() -> int:
    return getattr(settings, "LOGIN_FAILURE_WINDOW_S", 300)


def _key(username: str, addr: str | None) -> str:
    # Hashed: user names typed at the sign-in form are not stored in Redis in clear.
    digest = hashlib.sha256(f"{username.strip().lower()}\0{addr or '-'}".encode()).hexdigest()
    return f"npc:login-fail:{digest[:32]}"


def retry_after(username: str, addr: str | None) -> int | None:
    """Seconds until this user name may try again from `addr`, or None when not locked."""
    try:
        r = get_redis()
        key = _key(username, addr)
        count = int(r.get(key) or 0)
        if count < _limit():
            return None
        return max(1, int(r.ttl(key)))
    except redis.RedisError as exc:
        log.warning("sign-in rate limit unavailable (%s); not enforced", type(exc).__name__)
        return None


def note_failure(username: str, addr: str | None) -> None:
    """Count one failed sign-in; the attempt that reaches the limit writes an audit entry."""
    try:
        r = get_redis()
        key = _key(username, addr)
        pipe = r.pipeline()  # MULTI: the window starts with the first failure, INCR keeps it
        pipe.set(key, 0, ex=_window(), nx=True)
        pipe.incr(key)
        count = pipe.execute()[1]
    except redis.RedisError as exc:
        log.warning("sign-in rate limit unavailable (%s); not counted", type(exc).__name__)
        return
    if count == _limit():
        # The user name goes into the audit log only when it is a real account's: a mistyped
        # "user name" is sometimes a password.
        user = get_user_model().objects.filter(username=username).first()
        record(
            actor=Actor(user=None, name="anonymous", via="web", remote_addr=addr),
            action="login.locked",
            obj=user,
            message=(
                f"{count} failed sign-ins for {'this user' if user else 'an unknown user name'} "
                f"within {_window()} s; locked for this address"
            ),
        )


def clear(username: str, addr: str | None) -> None:
    try:
        get_redis().delete(_key(username, addr))
    except redis.RedisError:
        pass
