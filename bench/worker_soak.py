"""Console worker memory over a soak: flat under steady heartbeat + reconcile load.

Two real console workers (prefork, 2 processes each, as `make run` starts them) side by side
on a scratch database: the *loaded* one consumes the console queue — BENCH_NODES (1,000)
simulated nodes beating every 5 s through Celery, and the beat schedule (reconcile of
BENCH_DEPLOYMENTS deployments every 5 s, sample flush, offline detection, rollups) —, the
*idle* one an empty queue. The resident memory of each worker and its pool processes is
sampled every 10 s for BENCH_SECONDS (600). After BENCH_WARMUP (120 s: registration, caches,
first rollups) the loaded worker is "flat" when it grows less than 5% (exit 1 otherwise).

    .venv/bin/python bench/worker_soak.py
    BENCH_SECONDS=180 BENCH_WARMUP=60 .venv/bin/python bench/worker_soak.py
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

SECONDS = float(os.environ.get("BENCH_SECONDS", "600"))
WARMUP = float(os.environ.get("BENCH_WARMUP", "120"))
NODES = int(os.environ.get("BENCH_NODES", "1000"))
DEPLOYMENTS = int(os.environ.get("BENCH_DEPLOYMENTS", "100"))
EVERY = 10.0
MAX_GROWTH = 0.05


def main() -> int:
    from django.core.management import call_command

    from console.accounts.services import Actor
    from console.inventory.enrollment import issue_enrollment_token
    from console.inventory.models import Node

    call_command("migrate", verbosity=0)
    _, token = issue_enrollment_token(actor=Actor.system("bench"), name="bench")
    loaded = fleet.start_worker(SCRATCH.dir / "loaded.log", name="bench-loaded")
    idle = fleet.start_worker(SCRATCH.dir / "idle.log", queue="bench-idle", name="bench-idle")
    beat = fleet.start_beat(SCRATCH.dir / "beat.log", SCRATCH.dir)
    senders = fleet.Senders(token, NODES)
    rows: list[tuple[float, float, float]] = []
    try:
        fleet.wait_worker_ready()
        senders.start()
        t0 = time.monotonic()
        deployed = False
        print(f"{NODES} nodes beating every 5 s + reconcile, {SECONDS:g} s, load {_load()}")
        while (now := time.monotonic() - t0) < SECONDS:
            time.sleep(EVERY - (now % EVERY))
            if not deployed and Node.objects.count() >= NODES:
                _deploy()  # reconcile now has replicas to look at every 5 s
                deployed = True
            a, b = fleet.tree_rss_mb(loaded.pid), fleet.tree_rss_mb(idle.pid)
            rows.append((time.monotonic() - t0, a, b))
            print(f"  t={rows[-1][0]:5.0f} s  loaded {a:7.1f} MiB  idle {b:7.1f} MiB")
        sent = senders.sent.value
    finally:
        senders.stop()
        for p in (beat, loaded, idle):
            fleet.stop(p)
        SCRATCH.close()
    steady = [r for r in rows if r[0] >= WARMUP] or rows
    print(f"beats sent: {sent} ({sent / rows[-1][0]:.0f}/s); {DEPLOYMENTS} deployments reconciled")
    verdicts = []
    for name, i in (("loaded", 1), ("idle", 2)):
        start, end = steady[0][i], steady[-1][i]
        peak = max(r[i] for r in rows)
        growth = (end - start) / start
        per_min = fleet.slope([(r[0], r[i]) for r in steady]) * 60
        verdicts.append(growth)
        print(
            f"{name:6s} worker RSS: start {rows[0][i]:6.1f}, after warm-up {start:6.1f}, "
            f"end {end:6.1f}, max {peak:6.1f} MiB; growth after warm-up {growth:+.1%}, "
            f"slope {per_min:+.2f} MiB/min"
        )
    flat = verdicts[0] < MAX_GROWTH
    print(
        f"loaded worker {'flat' if flat else 'GROWS'} (< {MAX_GROWTH:.0%} after "
        f"{WARMUP:g} s warm-up); load {_load()}"
    )
    return 0 if flat else 1


def _deploy() -> None:
    """DEPLOYMENTS running deployments, 2 replicas x 4 NPUs each, on the beating nodes."""
    seeding._deployments(seeding.Scale(deployments=DEPLOYMENTS))


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
