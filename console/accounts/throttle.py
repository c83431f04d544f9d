"""Sign-in rate limiting: failed attempts counted per account + address and per account.

Guarantees (docs/security.md, "Sign-in rate limit"):

- The account is what Django would sign in: the typed name normalised exactly as the sign-in
  form does (strip, then NFKC — `UsernameField.to_python`), then the user's id when that
  name exists, else the normalised name case-folded. So `ｖｉｃｔｉｍ` (fullwidth) and `𝐯𝐢𝐜𝐭𝐢𝐦`
  (mathematical bold) count against `victim`, not against a fresh key of their own.
- After `LOGIN_FAILURE_LIMIT` (5) failures for one account from one address, or
  `LOGIN_ACCOUNT_FAILURE_LIMIT` (20) for one account from any addresses, within
  `LOGIN_FAILURE_WINDOW_S` (300 s, starting at the first failure), further attempts are
  refused with 429 — the password is not even checked. Each lockout writes one audit entry.
  A successful sign-in clears both counts.
- Counts live in Redis. When Redis cannot be reached the limits still hold, counted in this
  process (logged): an attacker gets at most the limits times the number of worker
  processes. The in-process table is bounded; when it is full of live entries every
  sign-in is refused until entries expire (fail closed under a flood).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UsernameField

from console.accounts.services import Actor, record
from console.hot import get_redis

log = logging.getLogger(__name__)

LOCAL_MAX_KEYS = 10_000  # in-process fallback: beyond this many live keys, refuse sign-in


def _limit() -> int:
    return getattr(settings, "LOGIN_FAILURE_LIMIT", 5)


def _account_limit() -> int:
    return getattr(settings, "LOGIN_ACCOUNT_FAILURE_LIMIT", 20)


def _window() -> int:
    return getattr(settings, "LOGIN_FAILURE_WINDOW_S", 300)


def normalize(username: str) -> str:
    """The name as the sign-in form hands it to the backend (strip + NFKC, Django's own)."""
    field = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD)
    return UsernameField(max_length=field.max_length or 254).to_python(username)


def _account(username: str):
    """(account id for the keys, the user or None). The lookup is the backend's: exact match
    on the normalised name (`get_by_natural_key`), so case is not folded for real users."""
    name = normalize(username)
    user = (
        get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: name}).first()
    )
    if user is not None:
        return f"user:{user.pk}", user
    return f"name:{name.casefold()}", None


def _hash(*parts: str) -> str:
    # Hashed: user names typed at the sign-in form are not stored in Redis in clear.
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _pair_key(account: str, addr: str | None) -> str:
    return f"npc:login-fail:{_hash(account, addr or '-')}"


def _account_key(account: str) -> str:
    return f"npc:login-fail-acct:{_hash(account)}"


def _key(username: str, addr: str | None) -> str:
    """The per-account-and-address key for a typed user name."""
    return _pair_key(_account(username)[0], addr)


# --- in-process fallback, used while Redis is unreachable -----------------------------------
_local: dict[str, tuple[int, float]] = {}  # key -> (count, monotonic expiry)
_local_lock = threading.Lock()


def _local_prune(now: float) -> None:
    for k in [k for k, (_, exp) in _local.items() if exp <= now]:
        del _local[k]


def _local_get(key: str) -> tuple[int, int]:
    """(count, seconds left); a full table reads as locked."""
    now = time.monotonic()
    with _local_lock:
        count, exp = _local.get(key, (0, now))
        if exp <= now:
            count = 0
        if count == 0 and len(_local) >= LOCAL_MAX_KEYS:
            _local_prune(now)
            if len(_local) >= LOCAL_MAX_KEYS:
                return 10**9, _window()
        return count, max(1, int(exp - now))


def _local_incr(key: str) -> int:
    now = time.monotonic()
    with _local_lock:
        count, exp = _local.get(key, (0, now))
        if exp <= now:
            count, exp = 0, now + _window()
        _local[key] = (count + 1, exp)
        return count + 1


# --- the limiter ----------------------------------------------------------------------------
def _counts(keys: list[str]) -> list[tuple[int, int]]:
    """(count, ttl) per key, from Redis or, when it is down, from this process."""
    try:
        r = get_redis()
        pipe = r.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
            pipe.ttl(key)
        out = pipe.execute()
        return [(int(out[i] or 0), int(out[i + 1])) for i in range(0, len(out), 2)]
    except redis.RedisError as exc:
        log.warning("sign-in rate limit: Redis unavailable (%s); counting in process", exc)
        return [_local_get(key) for key in keys]


def retry_after(username: str, addr: str | None) -> int | None:
    """Seconds until this account may try again from `addr`, or None when not locked."""
    account, _ = _account(username)
    limits = [_limit(), _account_limit()]
    counts = _counts([_pair_key(account, addr), _account_key(account)])
    waits = [
        max(1, ttl) for (count, ttl), limit in zip(counts, limits, strict=True) if count >= limit
    ]
    return max(waits) if waits else None


def _incr(keys: list[str]) -> list[int]:
    try:
        pipe = get_redis().pipeline()  # MULTI: the window starts with the first failure
        for key in keys:
            pipe.set(key, 0, ex=_window(), nx=True)
            pipe.incr(key)
        return pipe.execute()[1::2]
    except redis.RedisError as exc:
        log.warning("sign-in rate limit: Redis unavailable (%s); counting in process", exc)
        return [_local_incr(key) for key in keys]


def note_failure(username: str, addr: str | None) -> None:
    """Count one failed sign-in; the attempt that reaches a limit writes an audit entry."""
    account, user = _account(username)
    pair, total = _incr([_pair_key(account, addr), _account_key(account)])
    who = "this user" if user else "an unknown user name"
    # The user name goes into the audit log only when it is a real account's (obj): a
    # mistyped "user name" is sometimes a password.
    for count, limit, where in (
        (pair, _limit(), "locked for this address"),
        (total, _account_limit(), "locked for every address"),
    ):
        if count == limit:
            record(
                actor=Actor(user=None, name="anonymous", via="web", remote_addr=addr),
                action="login.locked",
                obj=user,
                message=f"{count} failed sign-ins for {who} within {_window()} s; {where}",
            )


def clear(username: str, addr: str | None) -> None:
    """Forget the failures of this account (from `addr` and in total)."""
    account, _ = _account(username)
    keys = [_pair_key(account, addr), _account_key(account)]
    try:
        get_redis().delete(*keys)
    except redis.RedisError:
        pass
    with _local_lock:
        for key in keys:
            _local.pop(key, None)
