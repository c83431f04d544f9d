"""Heartbeat ingest soak: 1,000 nodes beating every 5 s through the real Celery path.

A sender process beats for BENCH_NODES (1,000) simulated 8-NPU nodes, each every 5 s, spread
evenly (200 beats/s), with `send_task("console.heartbeat")` exactly as agents do. A real
console worker (prefork, 2 processes — `make run`'s) and beat (flush, offline detection,
rollups, reconcile) consume them against a scratch database (SQLite, or BENCH_DATABASE_URL)
and Redis (embedded, or BENCH_REDIS_URL). Every 5 s the console queue's length (LLEN) is
sampled. Prints beats/s sent vs needed, the queue's slope after warm-up (registration of
1,000 nodes), the worker's CPU use, and exit status 1 if the queue grows. Each sample also
reads the dashboard's fleet totals, as an open dashboard polls them: the running sums then
exist and every beat pays for keeping them (telemetry.services.fleet_totals).

    .venv/bin/python bench/heartbeat_soak.py                 # 300 s
    BENCH_SECONDS=60 .venv/bin/python bench/heartbeat_soak.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import seed as seeding  # noqa: E402

# not in multiprocessing children (spawn re-imports this module as __mp_main__)
SCRATCH = seeding.setup_django() if __name__ == "__main__" else None

from bench import fleet  # noqa: E402

SECONDS = float(os.environ.get("BENCH_SECONDS", "300"))
NODES = int(os.environ.get("BENCH_NODES", "1000"))
INTERVAL = 5.0
WARMUP = float(os.environ.get("BENCH_WARMUP", "60"))


def main() -> int:
    from django.core.management import call_command

    from console.accounts.services import Actor
    from console.hot import get_redis
    from console.inventory.enrollment import issue_enrollment_token
    from console.inventory.models import Node
    from console.telemetry.services import fleet_totals

    call_command("migrate", verbosity=0)
    _, token = issue_enrollment_token(actor=Actor.system("bench"), name="bench")
    r = get_redis()
    log = SCRATCH.dir / "worker.log"
    worker = fleet.start_worker(log)
    beat = fleet.start_beat(SCRATCH.dir / "beat.log", SCRATCH.dir)
    senders = fleet.Senders(token, NODES)
    samples: list[tuple[float, int, int]] = []  # (t, queue length, beats sent so far)
    try:
        fleet.wait_worker_ready()
        cpu0 = fleet.tree_cpu_s(worker.pid)
        senders.start()
        t0 = time.monotonic()
        print(f"{NODES} nodes x 8 NPUs every {INTERVAL:g} s, {SECONDS:g} s, load {_load()}")
        while (now := time.monotonic() - t0) < SECONDS:
            time.sleep(INTERVAL - (now % INTERVAL))
            n = fleet.queue_len(r)
            chips = fleet_totals()[0]  # as a dashboard's poll: the beats keep the sums
            samples.append((time.monotonic() - t0, n, senders.sent.value))
            print(
                f"  t={samples[-1][0]:5.0f} s  console queue {n:6d}  sent {senders.sent.value}"
                f"  live chips {chips}"
            )
        cpu = fleet.tree_cpu_s(worker.pid) - cpu0
        elapsed = time.monotonic() - t0
    finally:
        senders.stop()
        fleet.stop(beat)
        fleet.stop(worker)
    registered = Node.objects.filter(name__startswith="bench-").count()
    online = Node.objects.filter(name__startswith="bench-", status="online").count()
    SCRATCH.close()
    steady = [s for s in samples if s[0] >= WARMUP] or samples
    growth = fleet.slope([(t, n) for t, n, _ in steady])
    needed = NODES / INTERVAL
    (ta, _, sa), (tb, last, sb) = steady[0], steady[-1]
    rate = (sb - sa) / (tb - ta) if tb > ta else 0.0
    grows = growth > 1.0 or last > NODES  # > 1 msg/s, or a whole interval's beats waiting
    print(
        f"beats sent after warm-up: {rate:7.1f}/s   needed: {needed:.0f}/s   ratio {rate / needed:.2f}"
    )
    print(
        f"console queue after {WARMUP:g} s warm-up (registration): max "
        f"{max(n for _, n, _ in steady)}, last {last}, slope {growth:+.3f} msg/s -> "
        f"{'GROWS' if grows else 'does not grow'}"
    )
    print(
        f"console worker CPU: {cpu / elapsed:.2f} cores busy of {os.cpu_count()} "
        f"({1000 * cpu / max(samples[-1][2], 1):.2f} ms CPU per beat, Celery included); "
        f"{registered} nodes registered, {online} online; load {_load()}"
    )
    return 1 if grows or registered != NODES else 0


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
