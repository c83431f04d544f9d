"""The whole console-side heartbeat path vs. raw Redis round trips, side by side.

1,000 simulated nodes x 8 NPUs. Each beat goes through what the `console.heartbeat` task
runs — payload validation, the cached enrollment check, the node's cached state in Redis,
the coalesced database writes (none in steady state), the telemetry hot store — and is
compared in the same run with one bare Redis pipeline per beat carrying the same JSON.
Uses a scratch SQLite database and an embedded Redis (or REDIS_URL); leaves nothing behind.

    .venv/bin/python bench/heartbeat_console_path.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

SCRATCH = Path(tempfile.mkdtemp(prefix="npc-bench-"))
os.environ["DATABASE_URL"] = f"sqlite:///{SCRATCH / 'bench.sqlite3'}"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from console import embedded_redis  # noqa: E402
from console.accounts.services import Actor  # noqa: E402
from console.hot import get_redis  # noqa: E402
from console.inventory.enrollment import issue_enrollment_token  # noqa: E402
from console.inventory.heartbeats import ingest_heartbeat  # noqa: E402

NODES, NPUS, ROUNDS = int(os.environ.get("BENCH_NODES", "1000")), 8, 3


def payloads(token: str, at: datetime) -> list[dict]:
    out = []
    for n in range(NODES):
        chips = [
            {
                "npu_id": i,
                "chip_id": 0,
                "name": "910B3",
                "health": "OK",
                "power_w": 90.0 + i,
                "temperature_c": 40.0 + i,
                "aicore_percent": float((n + i) % 100),
                "hbm_used_mb": 30_000,
                "hbm_total_mb": 65_536,
                "bus_id": f"0000:{0xC1 + i:02X}:00.0",
            }
            for i in range(NPUS)
        ]
        out.append(
            {
                "node": f"bench-{n:04d}",
                "enroll_token": token,
                "sent_at": at.isoformat(),
                "host": {"hostname": f"bench-{n}", "arch": "aarch64"},
                "chips": chips,
            }
        )
    return out


def main() -> None:
    proc = None
    if not os.environ.get("REDIS_URL"):
        proc = embedded_redis.start(SCRATCH / "redis.sock", SCRATCH)
        settings.REDIS_URL = f"unix://{SCRATCH / 'redis.sock'}"
    try:
        call_command("migrate", verbosity=0)
        _, token = issue_enrollment_token(actor=Actor.system("bench"), name="bench")
        t0 = datetime.now(UTC)
        for p in payloads(token, t0):  # registration: the expensive first beat, not timed
            ingest_heartbeat(p, received_at=t0)
        r = get_redis()
        full, bare = [], []
        for k in range(1, ROUNDS + 1):
            at = t0 + timedelta(seconds=5 * k)
            batch = payloads(token, at)
            docs = [json.dumps(p).encode() for p in batch]
            start = time.perf_counter()
            for p in batch:
                ingest_heartbeat(p, received_at=at)
            full.append(NODES / (time.perf_counter() - start))
            start = time.perf_counter()
            for p, doc in zip(batch, docs, strict=True):
                pipe = r.pipeline(transaction=False)
                pipe.hgetall(f"npc:bench-bare:{p['node']}")
                pipe.set(f"npc:bench-bare:latest:{p['node']}", doc, ex=50)
                pipe.rpush("npc:bench-bare:samples", doc)
                pipe.execute()
            bare.append(NODES / (time.perf_counter() - start))
        f, b = statistics.median(full), statistics.median(bare)
        print(f"{NODES} nodes x {NPUS} NPUs, {ROUNDS} rounds, {os.cpu_count()} CPUs, one process")
        print(f"console heartbeat path: {f:8,.0f} beats/s ({1e6 / f:6.0f} us/beat)")
        print(f"bare Redis pipelines:   {b:8,.0f} beats/s ({1e6 / b:6.0f} us/beat)")
        print(f"ratio console/bare:     {f / b:8.2f}")
        for key in r.scan_iter("npc:*"):
            r.delete(key)
    finally:
        if proc is not None:
            embedded_redis.stop(proc)
        shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    main()
