"""The whole console-side heartbeat path vs. raw Redis round trips, side by side.

BENCH_NODES (1,000) enrolled nodes x 8 NPUs. Each beat is sealed with its node's own key as
the agent seals it (workers/channel.py) and goes through what the inbox consumer runs,
`Inbox.handle_batch` in batches of 500 (console/inventory/inbox.py): authentication (MAC,
active credential, time window, sequence, rate), payload validation, the node's cached state
in Redis, the coalesced database writes (none in steady state), the telemetry hot store. In the
same run, alternating round by round: the same work split in two — `Inbox.authenticate` alone
and `ingest_heartbeat` alone on the parsed payloads — and one bare Redis pipeline per beat
carrying the same JSON (HGETALL + SET + RPUSH), the floor. Prints beats/s and µs/beat of each
and the ratios. The first round (registration of every node: the expensive first beat) is not
timed. Uses a scratch SQLite database (or BENCH_DATABASE_URL) and an embedded Redis (or
BENCH_REDIS_URL); leaves nothing behind.

    .venv/bin/python bench/heartbeat_console_path.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import seed as seeding  # noqa: E402

SCRATCH = seeding.setup_django() if __name__ == "__main__" else None

from bench import fleet, inbox_path  # noqa: E402

NODES, NPUS = int(os.environ.get("BENCH_NODES", "1000")), 8
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def ingest_alone(bodies: list[tuple[str, dict]]) -> float:
    """Seconds for ingest_heartbeat on already-parsed payloads (no authentication)."""
    from console.inventory.heartbeats import ingest_heartbeat

    at = datetime.now(UTC)
    start = time.perf_counter()
    for name, body in bodies:
        ingest_heartbeat(body, node=name, received_at=at)
    return time.perf_counter() - start


def bare(r, docs: list[tuple[str, bytes]]) -> float:
    """Seconds for one bare pipeline per beat: read a node hash, write the beat, buffer it."""
    start = time.perf_counter()
    for name, doc in docs:
        pipe = r.pipeline(transaction=False)
        pipe.hgetall(f"npc:bench-bare:{name}")
        pipe.set(f"npc:bench-bare:latest:{name}", doc, ex=50)
        pipe.rpush("npc:bench-bare:samples", doc)
        pipe.execute()
    return time.perf_counter() - start


def main() -> None:
    try:
        report()
    finally:
        SCRATCH.close()


def report() -> None:
    from django.core.management import call_command

    from console.hot import get_redis
    from console.inventory.inbox import Inbox

    call_command("migrate", verbosity=0)
    nodes = fleet.enroll_fleet(NODES)
    r = get_redis()
    inbox, auth_inbox = Inbox(), Inbox()
    inbox_path.handle(inbox, inbox_path.sealed(nodes, inbox_path.beats(nodes, 0)))  # untimed
    inbox_path.authenticate(auth_inbox, inbox_path.sealed(nodes, inbox_path.beats(nodes, 0)))
    whole, auth, ingest, floor = [], [], [], []
    for k in range(1, ROUNDS + 1):
        bodies = inbox_path.beats(nodes, k)
        raws = inbox_path.sealed(nodes, bodies)
        auth_raws = inbox_path.sealed(nodes, bodies)
        docs = [(name, json.dumps(body).encode()) for name, body in bodies]
        parsed = [(name, json.loads(doc)) for name, doc in docs]
        whole.append(NODES / inbox_path.handle(inbox, raws))
        auth.append(NODES / inbox_path.authenticate(auth_inbox, auth_raws))
        ingest.append(NODES / ingest_alone(parsed))
        floor.append(NODES / bare(r, docs))
    w, a, i, b = (statistics.median(x) for x in (whole, auth, ingest, floor))
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{NODES} nodes x {NPUS} NPUs, {ROUNDS} rounds, {os.cpu_count()} CPUs, one process, load {load}"
    )
    print(f"console inbox path (handle_batch):  {w:8,.0f} beats/s ({1e6 / w:6.0f} us/beat)")
    print(f"  authentication alone:             {a:8,.0f} beats/s ({1e6 / a:6.0f} us/beat, "
          f"{100 * w / a:.0f} % of the path)")  # fmt: skip
    print(f"  ingest_heartbeat alone:           {i:8,.0f} beats/s ({1e6 / i:6.0f} us/beat)")
    print(f"bare Redis pipelines:               {b:8,.0f} beats/s ({1e6 / b:6.0f} us/beat)")
    print(f"ratio inbox path/bare:              {w / b:8.2f}")
    print(f"ratio ingest alone/bare:            {i / b:8.2f}")
    for key in r.scan_iter("npc:bench-bare:*"):
        r.delete(key)


if __name__ == "__main__":
    main()
