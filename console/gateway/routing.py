"""Which replica serves a request: the ready replicas of the named model, least loaded first.

Load = the replica's running + waiting requests from its last scraped vLLM metrics (the
agent reports them with every heartbeat) + the requests this gateway process has in flight
to it right now (the scrape is seconds old; the in-flight count is not). Ties go round-robin.
The table of ready replicas is read once per REFRESH_S for all models (one query and one
Redis MGET), never per request.

Replicas on SIMULATED nodes (`make demo`) are never upstreams: their engines are simulated by
the agent (workers/engine/simulated.py) and nothing listens on their ports, so a request is
answered at once with a 503 saying so rather than sent to an address where nothing (or, on a
shared demo host, something else) listens.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

REFRESH_S = 1.0
LOAD_MAX = 1e9  # requests: more than any engine holds
DOWN_S = 5.0  # a replica that refused a connection is tried last for this long


@dataclass(frozen=True)
class Upstream:
    replica_id: int
    name: str  # deployment/index, for logs and headers
    url: str
    scraped_load: float
    api_key: str = field(default="", repr=False)  # the replica's engine key, sent upstream


@dataclass
class Table:
    at: float = 0.0
    by_model: dict[str, list[Upstream]] = field(default_factory=dict)
    known_models: frozenset[str] = frozenset()
    # models with ready replicas on simulated nodes only: no upstream, a clear 503
    simulated_only: frozenset[str] = frozenset()


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
    from console.deployments.models import Deployment, Replica, ReplicaState, engine_api_key

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
            Upstream(r.pk, f"{r.deployment.name}/{r.index}", url, load, engine_api_key(r.pk))
        )
    known = frozenset(Deployment.objects.values_list("served_model_name", flat=True))
    return Table(time.monotonic(), by_model, known, frozenset(simulated - by_model.keys()))


class Router:
    def __init__(self) -> None:
        self.table = Table()
        self.inflight: Counter[int] = Counter()
        self.down_until: dict[int, float] = {}
        self._rr = itertools.count()
        self._lock = asyncio.Lock()

    async def refresh(self, force: bool = False) -> Table:
        if force or time.monotonic() - self.table.at > REFRESH_S:
            async with self._lock:
                if force or time.monotonic() - self.table.at > REFRESH_S:
                    self.table = await sync_to_async(_read_table)()
        return self.table

    async def candidates(self, model: str) -> list[Upstream]:
        table = await self.refresh()
        ups = list(table.by_model.get(model, ()))
        if not ups:
            return []
        now = time.monotonic()
        turn = next(self._rr)

        def key(item: tuple[int, Upstream]) -> tuple:
            i, up = item
            down = self.down_until.get(up.replica_id, 0) > now
            return (down, up.scraped_load + self.inflight[up.replica_id], (i - turn) % len(ups))

        return [up for _, up in sorted(enumerate(ups), key=key)]

    def acquire(self, up: Upstream) -> None:
        self.inflight[up.replica_id] += 1

    def release(self, up: Upstream) -> None:
        self.inflight[up.replica_id] -= 1
        if self.inflight[up.replica_id] <= 0:
            del self.inflight[up.replica_id]

    def mark_down(self, up: Upstream) -> None:
        self.down_until[up.replica_id] = time.monotonic() + DOWN_S
