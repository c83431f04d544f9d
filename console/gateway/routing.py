"""Which replica serves a request: the ready replicas of the named model, least loaded first.

Load = the replica's running + waiting requests from its last scraped vLLM metrics (the
agent reports them with every heartbeat) + the requests every console process has in flight
to it right now (the scrape is seconds old; the in-flight count is not). The in-flight
counts live in Redis, one sorted set of request ids per replica scored by a lease deadline
(a process that dies frees its requests when the lease ends), and one script reads them,
picks and counts the request in the chosen replica, atomically: two processes never both
see the same idle replica. Ties go round-robin.

Prefix affinity: requests that share a prompt prefix (or an `X-Session-ID`) go to the same
replica — chosen by rendezvous hashing, stable as replicas come and go — so vLLM's prefix
cache hits, unless that replica is busier than the least-loaded one by more than
AFFINITY_SLACK requests.

Overload: when every replica holds its capacity (the deployment's max_num_seqs) requests
queue in the engines; then each token gets at most its fair share of the model's capacity
(the capacity divided among the tokens with requests in flight: one heavy token cannot
starve the others: 429 `fair_share`), and when every replica holds SHED_FACTOR times its
capacity new requests are shed (503 with Retry-After) rather than queued without bound.

The table of ready replicas is read once per REFRESH_S for all models (one query and one
Redis MGET), never per request, and off the request path: a request that finds the table
stale is routed on it while one background task reads the next (a table older than STALE_S,
or none yet, is waited for).

Replicas on SIMULATED nodes (`make demo`) are never upstreams: their engines are simulated by
the agent (workers/engine/simulated.py) and nothing listens on their ports, so a request is
answered at once with a 503 saying so rather than sent to an address where nothing (or, on a
shared demo host, something else) listens.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from console.gateway import db

log = logging.getLogger("console.gateway")

REFRESH_S = 1.0
STALE_S = 10.0  # a table older than this is not used while the next one is read
LOAD_MAX = 1e9  # requests: more than any engine holds
DOWN_S = 5.0  # a replica that refused a connection is tried last for this long
# vLLM's max_num_seqs for the API server when a deployment sets none (vllm/engine/
# arg_utils.py, _get_default_max_num_seqs...: 256 on devices under 70 GiB, as a 910B's 64 GiB)
DEFAULT_CAPACITY = 256
AFFINITY_SLACK = 4  # requests: how much busier the affine replica may be than the idlest
SHED_FACTOR = 2.0  # shed when every replica holds this many times its capacity
LEASE_S = 600.0  # an in-flight entry not renewed (streams: every RENEW_S) ends after this
RENEW_S = 60.0
INFLIGHT = "npc:gw:in:"  # + replica id: that replica's requests in flight, all processes
OWN = "npc:gw:own:"  # + model key + ":" + token id: that token's requests for that model
ACTIVE = "npc:gw:act:"  # + model key: the tokens with requests in flight for that model
PREFIX_CHARS = 512  # the prompt prefix that makes the affinity key


@dataclass(frozen=True)
class Upstream:
    replica_id: int
    name: str  # deployment/index, for logs and headers
    url: str
    scraped_load: float
    api_key: str = field(default="", repr=False)  # the replica's engine key, sent upstream
    capacity: int = DEFAULT_CAPACITY  # requests it runs at once (max_num_seqs)
    spec_version: int = 0


@dataclass
class Table:
    at: float = 0.0
    by_model: dict[str, list[Upstream]] = field(default_factory=dict)
    known_models: frozenset[str] = frozenset()
    # models with ready replicas on simulated nodes only: no upstream, a clear 503
    simulated_only: frozenset[str] = frozenset()
    # model -> (spec version of its canary, percent of requests it takes): rollouts paused
    # at their canary (console/deployments/rollout.py)
    canaries: dict[str, tuple[int, int]] = field(default_factory=dict)


def canary_share(ups: list[Upstream], canary: tuple[int, int] | None, draw: float) -> list:
    """The upstreams a request may go to: with a canary and both generations serving, the
    canary's replicas for `draw` (0..100) under its percent, the others otherwise."""
    if canary is None:
        return ups
    version, percent = canary
    new = [u for u in ups if u.spec_version == version]
    old = [u for u in ups if u.spec_version != version]
    if not new or not old:
        return ups
    return new if draw < percent else old


def scraped_load(metrics: dict) -> float:
    """Running + waiting requests of a replica's last scrape. Never raises: a value that is
    not a finite, non-negative number counts as 0 (a bad value in Redis must not fail every
    route), and the load is capped so that two huge values do not add up to infinity."""
    load = 0.0
    for key in ("num_requests_running", "num_requests_waiting"):
        value = metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                continue
            if math.isfinite(number) and number > 0:
                load += min(number, LOAD_MAX)
    return load


def _read_table() -> Table:
    from console.deployments.engines import engine_metrics
    from console.deployments.models import (
        Deployment,
        Replica,
        ReplicaState,
        Rollout,
        RolloutState,
        engine_api_key,
    )

    replicas = list(
        Replica.objects.filter(state=ReplicaState.READY, node__isnull=False, port__isnull=False)
        .select_related("deployment", "node")
        .order_by("pk")
    )
    metrics = engine_metrics([r.pk for r in replicas])
    by_model: dict[str, list[Upstream]] = {}
    simulated: set[str] = set()
    for r in replicas:
        if r.node.simulated:
            simulated.add(r.deployment.served_model_name)
            continue
        url = r.base_url
        if url is None:  # its node reports no usable address: no upstream to send to
            continue
        m = metrics.get(r.pk, {})
        load = scraped_load(m)
        by_model.setdefault(r.deployment.served_model_name, []).append(
            Upstream(
                r.pk,
                f"{r.deployment.name}/{r.index}",
                url,
                load,
                engine_api_key(r.pk),
                r.deployment.max_num_seqs or DEFAULT_CAPACITY,
                r.spec_version,
            )
        )
    known = frozenset(Deployment.objects.values_list("served_model_name", flat=True))
    canaries = {
        ro.deployment.served_model_name: (ro.to_version, ro.canary_percent)
        for ro in Rollout.objects.filter(
            state=RolloutState.ROLLING, canary_percent__gt=0, promoted_at__isnull=True
        ).select_related("deployment")
    }
    return Table(
        time.monotonic(), by_model, known, frozenset(simulated - by_model.keys()), canaries
    )


# KEYS: per candidate its in-flight set, then the token's own set and the model's active set
# ARGV: now, request id, lease deadline, token id, turn, affinity (1-based, 0: none), slack,
#       shed factor, then per candidate: scraped load, capacity, down (1/0)
# Returns {0, chosen (1-based), loads...} | {1, 0, loads...} shed | {2, share, loads...}
PICK = """
local now = tonumber(ARGV[1])
local n = #KEYS - 2
local own, active = KEYS[n + 1], KEYS[n + 2]
local loads, caps, down = {}, {}, {}
local all_full, all_shed, total_cap = true, true, 0
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  local base = 9 + (i - 1) * 3
  loads[i] = tonumber(ARGV[base]) + redis.call('ZCARD', KEYS[i])
  caps[i] = tonumber(ARGV[base + 1])
  down[i] = tonumber(ARGV[base + 2])
  total_cap = total_cap + caps[i]
  if loads[i] < caps[i] then all_full = false end
  if loads[i] < caps[i] * tonumber(ARGV[8]) then all_shed = false end
end
if all_shed then
  return {1, 0, unpack(loads)}
end
redis.call('ZREMRANGEBYSCORE', own, '-inf', now)
redis.call('ZREMRANGEBYSCORE', active, '-inf', now)
if all_full then
  local mine = redis.call('ZCARD', own)
  local tokens = redis.call('ZCARD', active)
  if mine == 0 then tokens = tokens + 1 end
  local share = math.max(1, math.floor(total_cap / tokens))
  if mine >= share then
    return {2, share, unpack(loads)}
  end
end
local turn = tonumber(ARGV[5])
local best = nil
for i = 1, n do
  if best == nil then
    best = i
  else
    local a = {down[i], loads[i], (i - 1 - turn) % n}
    local b = {down[best], loads[best], (best - 1 - turn) % n}
    if a[1] < b[1] or (a[1] == b[1] and (a[2] < b[2] or (a[2] == b[2] and a[3] < b[3]))) then
      best = i
    end
  end
end
local aff = tonumber(ARGV[6])
if aff > 0 and down[aff] == 0 and loads[aff] <= loads[best] + tonumber(ARGV[7]) then
  best = aff
end
redis.call('ZADD', KEYS[best], ARGV[3], ARGV[2])
redis.call('EXPIRE', KEYS[best], math.ceil(tonumber(ARGV[3]) - now) + 60)
redis.call('ZADD', own, ARGV[3], ARGV[2])
redis.call('EXPIRE', own, math.ceil(tonumber(ARGV[3]) - now) + 60)
redis.call('ZADD', active, ARGV[3], ARGV[4])
redis.call('EXPIRE', active, math.ceil(tonumber(ARGV[3]) - now) + 60)
return {0, best, unpack(loads)}
"""

# KEYS: the replica's in-flight set, the token's own set, the model's active set
# ARGV: request id, token id
_DONE = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[3], ARGV[2])
end
return 0
"""


def model_key(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()[:16]


def affinity_key(headers, path: str, payload: dict) -> str | None:
    """What makes requests share a replica: the client's `X-Session-ID`, else the prompt's
    first PREFIX_CHARS characters (system messages first for chat: they are what requests of
    one application share), else None. `X-NPC-Affinity: off` asks for plain least-loaded."""
    if (headers.get("x-npc-affinity") or "").lower() == "off":
        return None
    if session := headers.get("x-session-id"):
        return "s:" + session[:200]
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(payload.get("messages"), list):
        msgs = [m for m in payload["messages"] if isinstance(m, dict)]
        ordered = [m for m in msgs if m.get("role") == "system"] + [
            m for m in msgs if m.get("role") != "system"
        ]
        parts: list[str] = []
        size = 0
        for m in ordered:
            content = m.get("content")
            text = content if isinstance(content, str) else str(content)
            parts.append(text)
            size += len(text)
            if size >= PREFIX_CHARS:
                break
        text = "\x1e".join(parts)
    else:
        return None
    if len(text) < 32:  # too short to share a cached block
        return None
    return "p:" + text[:PREFIX_CHARS]


def affine(key: str, ups: list[Upstream]) -> int:
    """The index of the replica that `key` prefers (rendezvous hashing: a replica joining or
    leaving moves only the keys that preferred it)."""

    def weight(up: Upstream) -> bytes:
        return hashlib.blake2b(f"{up.replica_id}|{key}".encode(), digest_size=8).digest()

    return max(range(len(ups)), key=lambda i: weight(ups[i]))


@dataclass
class Lease:
    """A request counted in flight on a replica (in Redis, for every console process)."""

    request_id: str
    token_id: int
    model: str
    replica_id: int
    shared: bool = True  # False: Redis was unreachable, counted in this process only
    renewed_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class PickPlan:
    """One pick, ready to run: the upstreams in the script's order, the lease it fills in,
    the script's keys and arguments, which upstreams this process holds down."""

    ups: list[Upstream]
    lease: Lease
    keys: list[str]
    args: list[object]
    down: list[bool]


@dataclass(frozen=True)
class Overloaded:
    """No replica is picked: shed (every replica far past its capacity) or past this
    token's fair share while every replica is full."""

    kind: str  # "shed" | "fair_share"
    share: int = 0


class Router:
    def __init__(self) -> None:
        self.table = Table()
        self.inflight: Counter[int] = Counter()
        self.down_until: dict[int, float] = {}
        self._rr = itertools.count()  # ties in candidates(): this process alone
        # ties in pick(): its own counter, or a request (which calls both) would step one
        # shared counter twice and, with two replicas, always break ties the same way
        self._pick_rr = itertools.count()
        self._lock = asyncio.Lock()
        self._background = db.Background("reading the routing table")
        self._scripts: dict[tuple[int, str], object] = {}
        self._warned = 0.0

    async def refresh(self, force: bool = False) -> Table:
        """The table, read again when older than REFRESH_S: in the background while the
        current one is younger than STALE_S, else (or when `force`d) before answering."""
        age = time.monotonic() - self.table.at
        if not force and age <= REFRESH_S:
            return self.table
        if not force and age <= STALE_S:
            self._background.start(self._read)
            return self.table
        await self._read(force)
        return self.table

    async def _read(self, force: bool = False) -> None:
        async with self._lock:
            if force or time.monotonic() - self.table.at > REFRESH_S:
                self.table = await db.read(_read_table)

    async def candidates(self, model: str) -> list[Upstream]:
        """The ready upstreams of `model`, best first by what this process knows alone."""
        table = await self.refresh()
        ups = canary_share(
            list(table.by_model.get(model, ())), table.canaries.get(model), random.uniform(0, 100)
        )
        if not ups:
            return []
        now = time.monotonic()
        turn = next(self._rr)

        def key(item: tuple[int, Upstream]) -> tuple:
            i, up = item
            down = self.down_until.get(up.replica_id, 0) > now
            return (down, up.scraped_load + self.inflight[up.replica_id], (i - turn) % len(ups))

        return [up for _, up in sorted(enumerate(ups), key=key)]

    def script(self, redis, source: str):
        key = (id(redis), source)
        script = self._scripts.get(key)
        if script is None:
            script = self._scripts[key] = redis.register_script(source)
        return script

    async def pick(
        self,
        redis,
        model: str,
        ups: list[Upstream],
        *,
        token_id: int,
        affinity: str | None = None,
    ) -> tuple[list[Upstream], Lease] | Overloaded:
        """Order `ups` with the replica to try first at the head, counting the request in
        flight there for every console process; or say the model is overloaded."""
        plan = self.plan(model, ups, token_id=token_id, affinity=affinity)
        try:
            reply = await self.script(redis, PICK)(keys=plan.keys, args=plan.args)
        except Exception as exc:  # routing outranks sharing: fall back to this process alone
            return await self.alone(plan, exc)
        return self.outcome(plan, reply)

    def plan(
        self, model: str, ups: list[Upstream], *, token_id: int, affinity: str | None = None
    ) -> PickPlan:
        """The pick script's keys and arguments for one request (entry.py runs it in the
        same round trip as the admission check)."""
        ups = sorted(ups, key=lambda up: up.replica_id)  # one order for every process
        now_m = time.monotonic()
        now = time.time()
        lease = Lease(uuid.uuid4().hex, token_id, model, 0)
        mk = model_key(model)
        keys = [INFLIGHT + str(up.replica_id) for up in ups]
        keys += [f"{OWN}{mk}:{token_id}", ACTIVE + mk]
        args: list[object] = [
            now,
            lease.request_id,
            now + LEASE_S,
            token_id,
            next(self._pick_rr) % len(ups),
            affine(affinity, ups) + 1 if affinity else 0,
            AFFINITY_SLACK,
            SHED_FACTOR,
        ]
        down = [self.down_until.get(up.replica_id, 0) > now_m for up in ups]
        for up, is_down in zip(ups, down, strict=True):
            args += [up.scraped_load, up.capacity, int(is_down)]
        return PickPlan(ups, lease, keys, args, down)

    def outcome(self, plan: PickPlan, reply) -> tuple[list[Upstream], Lease] | Overloaded:
        """What the pick script's answer means: the order to try, or overloaded."""
        code, chosen, *loads = reply
        if int(code) == 1:
            return Overloaded("shed")
        if int(code) == 2:
            return Overloaded("fair_share", int(chosen))
        ups, lease = plan.ups, plan.lease
        first = int(chosen) - 1
        rest = sorted(
            (i for i in range(len(ups)) if i != first),
            key=lambda i: (plan.down[i], float(loads[i])),
        )
        lease.replica_id = ups[first].replica_id
        self.inflight[lease.replica_id] += 1
        return [ups[first], *(ups[i] for i in rest)], lease

    async def alone(self, plan: PickPlan, exc: Exception) -> tuple[list[Upstream], Lease]:
        """Redis failed the pick: this process's own order and count."""
        self._warn(exc)
        order = await self.candidates(plan.lease.model)
        lease = plan.lease
        lease.replica_id, lease.shared = order[0].replica_id, False
        self.inflight[lease.replica_id] += 1
        return order, lease

    async def move(self, redis, lease: Lease, to: Upstream) -> None:
        """Count the request on `to` instead (failover to the next replica)."""
        self._local_release(lease.replica_id)
        old, lease.replica_id = lease.replica_id, to.replica_id
        self.inflight[to.replica_id] += 1
        if not lease.shared:
            return
        try:
            pipe = redis.pipeline(transaction=False)
            pipe.zrem(INFLIGHT + str(old), lease.request_id)
            pipe.zadd(INFLIGHT + str(to.replica_id), {lease.request_id: time.time() + LEASE_S})
            pipe.expire(INFLIGHT + str(to.replica_id), int(LEASE_S) + 60)
            await pipe.execute()
        except Exception as exc:
            self._warn(exc)

    async def renew(self, redis, lease: Lease) -> None:
        """Push a long stream's lease forward (every RENEW_S)."""
        if not lease.shared or time.monotonic() - lease.renewed_at < RENEW_S:
            return
        lease.renewed_at = time.monotonic()
        deadline = time.time() + LEASE_S
        mk = model_key(lease.model)
        try:
            pipe = redis.pipeline(transaction=False)
            pipe.zadd(INFLIGHT + str(lease.replica_id), {lease.request_id: deadline}, xx=True)
            pipe.zadd(f"{OWN}{mk}:{lease.token_id}", {lease.request_id: deadline}, xx=True)
            pipe.zadd(ACTIVE + mk, {str(lease.token_id): deadline}, gt=True)
            await pipe.execute()
        except Exception as exc:
            self._warn(exc)

    async def done(self, redis, lease: Lease) -> None:
        """The request ended: it is no longer in flight anywhere."""
        try:
            pipe = redis.pipeline(transaction=False)
            await self.done_into(redis, pipe, lease)
            await pipe.execute()
        except Exception as exc:
            self._warn(exc)

    async def done_into(self, redis, pipe, lease: Lease) -> None:
        """`done`, its Redis part added to a pipeline (of `redis`) the caller executes."""
        self._local_release(lease.replica_id)
        if not lease.shared:
            return
        mk = model_key(lease.model)
        keys = [INFLIGHT + str(lease.replica_id), f"{OWN}{mk}:{lease.token_id}", ACTIVE + mk]
        # queued, not sent: a script call on a pipeline waits for the pipeline's execute
        await self.script(redis, _DONE)(
            keys=keys, args=[lease.request_id, lease.token_id], client=pipe
        )

    def _local_release(self, replica_id: int) -> None:
        self.inflight[replica_id] -= 1
        if self.inflight[replica_id] <= 0:
            del self.inflight[replica_id]

    def mark_down(self, up: Upstream) -> None:
        self.down_until[up.replica_id] = time.monotonic() + DOWN_S

    def _warn(self, exc: Exception) -> None:
        if time.monotonic() - self._warned > 60:
            self._warned = time.monotonic()
            log.warning("in-flight counts not shared (Redis unreachable): %s", exc)
