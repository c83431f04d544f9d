"""Which replica serves a request: the ready replicas of the named model, least loaded first.

Load = the replica's running + waiting requests from its last scraped vLLM metrics (the
agent reports them with every heartbeat) + the requests this gateway process has in flight
to it right now (the scrape is seconds old; the in-flight count is not). Ties go round-robin.
The table of ready replicas is read once per REFRESH_S for all models (one query and one
Redis MGET), never per request.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

REFRESH_S = 1.0
DOWN_S = 5.0  # a replica that refused a connection is tried last for this long


@dataclass(frozen=True)
class Upstream:
    replica_id: int
    name: str  # deployment/index, for logs and headers
    url: str
    scraped_load: float


@dataclass
class Table:
    at: float = 0.0
    by_model: dict[str, list[Upstream]] = field(default_factory=dict)
    known_models: frozenset[str] = frozenset()


def _read_table() -> Table:
    from console.deployments.engines import engine_metrics
    from console.deployments.models import Deployment, Replica, ReplicaState

    replicas = list(
        Replica.objects.filter(state=ReplicaState.READY, node__isnull=False, port__isnull=False)
        .select_related("deployment", "node")
        .order_by("pk")
    )
    metrics = engine_metrics([r.pk for r in replicas])
    by_model: dict[str, list[Upstream]] = {}
    for r in replicas:
        m = metrics.get(r.pk, {})
        load = float(m.get("num_requests_running") or 0) + float(m.get("num_requests_waiting") or 0)
        by_model.setdefault(r.deployment.served_model_name, []).append(
            Upstream(r.pk, f"{r.deployment.name}/{r.index}", r.base_url, load)
        )
    known = frozenset(Deployment.objects.values_list("served_model_name", flat=True))
    return Table(time.monotonic(), by_model, known)


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
