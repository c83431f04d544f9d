"""Rate limits on the gateway, shared by every console process (issue 17).

A request is admitted by one Redis script (atomic, so two console processes never both take
the last slot): for each limit that binds it (RateLimit rows: token, model, token on model,
default per token) the script checks

- requests in the current minute (a counter per limit and minute; fixed windows: exact and
  cheap; a client can send at most 2x its rate across a minute boundary),
- tokens in the current minute (prompt + completion, added when the answer ends: a request
  that starts under the limit may finish over it; the next one waits for the next minute),
- concurrent requests (a sorted set of request ids scored by a lease deadline, so a console
  process that dies mid-request frees its slots when the lease ends; streams renew it),

and only when every one has room counts the request in all of them. A refusal names the
limit and says when to retry (`Retry-After`: the seconds to the next minute, or 1 for a
concurrency limit). When Redis cannot be reached the gateway serves without limits and logs
it (serving outranks limiting; the console's own health checks report Redis down).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from dataclasses import dataclass

from console.gateway import db

log = logging.getLogger("console.gateway")

REFRESH_S = 30.0  # the table is read again this often, and at once when VERSION changes
VERSION = "npc:gw:lim:version"  # bumped by every change of a limit (services.py)
# With no limit set at all a request costs no Redis round trip: the empty table is trusted
# for this long, so the first limit ever set binds within a second; once any limit exists,
# every request checks the version in the admission script and a change binds at once.
EMPTY_TRUST_S = 1.0
LEASE_S = 600.0  # a concurrency slot held longer than this without renewal is freed
RENEW_S = 60.0  # a stream renews its slots this often
KEY = "npc:gw:lim:"

# KEYS: the limits' version, then per limit [requests counter, tokens counter, concurrency set]
# ARGV: now (s), request id, lease deadline (s), the version this process holds, then per
# limit: rpm, tpm, concurrent (0 = off). Returns {-2, version} when the process's table is
# stale (a limit changed since it was read), {-1, ''} when admitted, {i, what} when refused.
ADMIT = """
local version = redis.call('GET', KEYS[1]) or '0'
if version ~= ARGV[4] then
  return {-2, version}
end
local now = tonumber(ARGV[1])
local n = (#KEYS - 1) / 3
for i = 0, n - 1 do
  local rpm = tonumber(ARGV[5 + i * 3])
  local tpm = tonumber(ARGV[6 + i * 3])
  local conc = tonumber(ARGV[7 + i * 3])
  if rpm > 0 and tonumber(redis.call('GET', KEYS[i * 3 + 2]) or '0') >= rpm then
    return {i, 'requests'}
  end
  if tpm > 0 and tonumber(redis.call('GET', KEYS[i * 3 + 3]) or '0') >= tpm then
    return {i, 'tokens'}
  end
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[i * 3 + 4], '-inf', now)
    if redis.call('ZCARD', KEYS[i * 3 + 4]) >= conc then
      return {i, 'concurrent'}
    end
  end
end
for i = 0, n - 1 do
  if tonumber(ARGV[5 + i * 3]) > 0 then
    redis.call('INCR', KEYS[i * 3 + 2])
    redis.call('EXPIRE', KEYS[i * 3 + 2], 120)
  end
  if tonumber(ARGV[7 + i * 3]) > 0 then
    redis.call('ZADD', KEYS[i * 3 + 4], ARGV[3], ARGV[2])
    redis.call('EXPIRE', KEYS[i * 3 + 4], math.ceil(tonumber(ARGV[3]) - now) + 60)
  end
end
return {-1, ''}
"""


@dataclass(frozen=True)
class Limit:
    scope: str  # what it binds, for keys and messages: "token 7", "model m", ...
    key: str  # the Redis key stem of its counters
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    concurrent: int = 0


@dataclass(frozen=True)
class Refusal:
    limit: Limit
    what: str  # requests | tokens | concurrent
    retry_after: int

    @property
    def message(self) -> str:
        if self.what == "concurrent":
            return f"rate limit: {self.limit.concurrent} concurrent requests for {self.limit.scope}"
        if self.what == "tokens":
            return f"rate limit: {self.limit.tokens_per_minute} tokens/min for {self.limit.scope}"
        return f"rate limit: {self.limit.requests_per_minute} requests/min for {self.limit.scope}"


@dataclass
class Admission:
    """A request let in: the slots to free and the token counters to add to at its end."""

    request_id: str
    limits: tuple[Limit, ...]
    renewed_at: float = 0.0

    @property
    def holds_slots(self) -> bool:
        return any(lim.concurrent for lim in self.limits)


@dataclass(frozen=True)
class Plan:
    """One admission check, ready to run: the script's keys and arguments (entry.py runs it
    in the same round trip as the replica pick)."""

    admission: Admission
    keys: list[str]
    args: list[object]
    now: float


def _model_key(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()[:16]


def _limit(scope: str, key: str, row: dict) -> Limit:
    return Limit(
        scope=scope,
        key=KEY + key,
        requests_per_minute=row["requests_per_minute"] or 0,
        tokens_per_minute=row["tokens_per_minute"] or 0,
        concurrent=row["concurrent"] or 0,
    )


@dataclass
class Table:
    at: float = -math.inf
    rows: dict[tuple[int | None, str], dict] | None = None
    version: str = ""

    def binding(self, token_id: int, model: str) -> tuple[Limit, ...]:
        """The limits that bind a request of `token_id` for `model` (pure)."""
        rows = self.rows or {}
        out = []
        mk = _model_key(model)
        if row := rows.get((token_id, model)):
            out.append(_limit(f"token {token_id} on model {model!r}", f"t{token_id}:m{mk}", row))
        if row := rows.get((token_id, "")) or rows.get((None, "")):
            out.append(_limit(f"token {token_id}", f"t{token_id}", row))
        if row := rows.get((None, model)):
            out.append(_limit(f"model {model!r}", f"m{mk}", row))
        return tuple(lim for lim in out if _active(lim))


def _active(lim: Limit) -> bool:
    return bool(lim.requests_per_minute or lim.tokens_per_minute or lim.concurrent)


def bump_version() -> None:
    """Tell every console process that a limit changed (call after the change commits)."""
    from console.hot import get_redis

    get_redis().incr(VERSION)


def _read_rows() -> tuple[str, dict[tuple[int | None, str], dict]]:
    """The version, then the rows: read in this order, a change racing the read makes the
    version older than the rows, never newer, so the next request reads them again."""
    from console.hot import get_redis

    from .models import RateLimit

    version = (get_redis().get(VERSION) or b"0").decode()
    return version, {
        (r["token_id"], r["model"]): r
        for r in RateLimit.objects.values(
            "token_id", "model", "requests_per_minute", "tokens_per_minute", "concurrent"
        )
    }


class Limiter:
    """One per process: the cached limits table and the admission script."""

    def __init__(self) -> None:
        self.table = Table()
        self._background = db.Background("reading the rate limits")
        self._scripts: dict[int, object] = {}
        self._warned = 0.0

    async def refresh(self, force: bool = False) -> Table:
        """The table; read again before answering when `force`d or never read, in the
        background when older than REFRESH_S (the admission script's version check makes a
        stale table safe: it answers "stale" and the caller forces a read)."""
        if force or self.table.rows is None:
            await self._read()
        elif time.monotonic() - self.table.at > REFRESH_S:
            self._background.start(self._read)
        return self.table

    async def _read(self) -> None:
        version, rows = await db.read(_read_rows)
        self.table = Table(time.monotonic(), rows, version)

    def forget(self) -> None:
        self.table = Table()

    def _script(self, redis):
        script = self._scripts.get(id(redis))
        if script is None:
            script = self._scripts[id(redis)] = redis.register_script(ADMIT)
        return script

    async def plan(self, token_id: int, model: str, *, force: bool = False) -> Plan | None:
        """The admission check of a request, or None when none is needed (no limit exists
        and the empty table is fresh). `force`: read the table again first (it was stale)."""
        table = await self.refresh(force)
        if not table.rows and time.monotonic() - table.at < EMPTY_TRUST_S:
            return None
        limits = table.binding(token_id, model)
        admission = Admission(uuid.uuid4().hex, limits, time.monotonic())
        now = time.time()
        minute = int(now // 60)
        keys: list[str] = [VERSION]
        args: list[object] = [now, admission.request_id, now + LEASE_S, table.version]
        for lim in limits:
            keys += [f"{lim.key}:r:{minute}", f"{lim.key}:t:{minute}", f"{lim.key}:c"]
            args += [lim.requests_per_minute, lim.tokens_per_minute, lim.concurrent]
        return Plan(admission, keys, args, now)

    @staticmethod
    def outcome(plan: Plan, index, what) -> Admission | Refusal | None:
        """What the script's answer means: admitted, refused, or None — the table is stale
        (a limit changed since this process read it): plan again with `force`."""
        index = int(index)
        if index == -2:
            return None
        if index < 0:
            return plan.admission
        what = what.decode() if isinstance(what, bytes) else str(what)
        retry = 1 if what == "concurrent" else max(1, math.ceil(60 - plan.now % 60))
        return Refusal(plan.admission.limits[index], what, retry)

    def unlimited(self, plan: Plan | None, exc: Exception) -> Admission:
        """Redis failed the check: serving outranks limiting, the request goes in unlimited."""
        self._warn(exc)
        return Admission(plan.admission.request_id if plan else "", ())

    async def admit(self, redis, token_id: int, model: str) -> Admission | Refusal:
        """Let the request in, counting it in every limit that binds it, or refuse it."""
        force = False
        for _ in range(2):
            plan = await self.plan(token_id, model, force=force)
            if plan is None:
                return Admission("", ())
            try:
                index, what = await self._script(redis)(keys=plan.keys, args=plan.args)
            except Exception as exc:
                return self.unlimited(plan, exc)
            result = self.outcome(plan, index, what)
            if result is not None:
                return result
            force = True
        return Admission(plan.admission.request_id, ())  # changing under us twice: let it pass

    async def renew(self, redis, admission: Admission) -> None:
        """Push the lease of a long request's slots forward (streams, every RENEW_S)."""
        if not admission.holds_slots or time.monotonic() - admission.renewed_at < RENEW_S:
            return
        admission.renewed_at = time.monotonic()
        deadline = time.time() + LEASE_S
        try:
            pipe = redis.pipeline(transaction=False)
            for lim in admission.limits:
                if lim.concurrent:
                    pipe.zadd(f"{lim.key}:c", {admission.request_id: deadline}, xx=True)
            await pipe.execute()
        except Exception as exc:
            self._warn(exc)

    async def release(self, redis, admission: Admission, tokens: int) -> None:
        """Free the request's slots and add its tokens to this minute's counters."""
        if not admission.limits:
            return
        try:
            pipe = redis.pipeline(transaction=False)
            self.release_into(pipe, admission, tokens)
            await pipe.execute()
        except Exception as exc:
            self._warn(exc)

    @staticmethod
    def release_into(pipe, admission: Admission, tokens: int) -> None:
        """`release`'s commands, added to a pipeline the caller executes."""
        minute = int(time.time() // 60)
        for lim in admission.limits:
            if lim.concurrent:
                pipe.zrem(f"{lim.key}:c", admission.request_id)
            if lim.tokens_per_minute and tokens > 0:
                pipe.incrby(f"{lim.key}:t:{minute}", tokens)
                pipe.expire(f"{lim.key}:t:{minute}", 120)

    def _warn(self, exc: Exception) -> None:
        if time.monotonic() - self._warned > 60:
            self._warned = time.monotonic()
            log.warning("rate limits not enforced (Redis unreachable): %s", exc)
