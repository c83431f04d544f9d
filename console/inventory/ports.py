"""Which TCP ports on a node are taken by something other than our engines.

Two sources, both in Redis: the ports the node's agent reports listening (every heartbeat;
stored only when the set changes) and the ports a start was refused on ("port N is already in
use on this host"), remembered for BUSY_FOR_S. The scheduler gives an engine none of them.
"""

from __future__ import annotations

import logging
import time

import orjson

from console.hot import get_redis

log = logging.getLogger(__name__)
BUSY_FOR_S = 600
LISTENING_TTL_S = 3600  # as the node's cached state: a node silent for an hour is re-learnt


def listening_key(node: str) -> str:
    return f"npc:ports:listening:{node}"


def busy_key(node: str) -> str:
    return f"npc:ports:busy:{node}"


def record_listening(node: str, ports: list[int]) -> None:
    """The node's agent reported these listening ports (called when the set changed)."""
    get_redis().set(listening_key(node), orjson.dumps(sorted(ports)), ex=LISTENING_TTL_S)


def mark_busy(node: str, port: int, now: float | None = None) -> None:
    """A start on `port` was refused because something listens there: skip it a while."""
    now = time.time() if now is None else now
    r = get_redis()
    pipe = r.pipeline(transaction=False)
    pipe.zadd(busy_key(node), {str(port): now + BUSY_FOR_S})
    pipe.zremrangebyscore(busy_key(node), "-inf", now)
    pipe.expire(busy_key(node), BUSY_FOR_S)
    pipe.execute()


def taken(node: str, now: float | None = None) -> set[int]:
    """Ports on `node` an engine must not be given; empty when Redis cannot be read (the
    agent's bind test still refuses a busy port, and the replica is then moved)."""
    now = time.time() if now is None else now
    try:
        pipe = get_redis().pipeline(transaction=False)
        pipe.get(listening_key(node))
        pipe.zrangebyscore(busy_key(node), now, "+inf")
        listening, busy = pipe.execute()
    except Exception:  # noqa: BLE001 - Redis away: placement goes on without this hint
        log.warning("could not read the taken ports of node %s", node)
        return set()
    ports = set(orjson.loads(listening)) if listening else set()
    return ports | {int(p) for p in busy}
