"""Console worker memory over a soak: flat under steady heartbeat + reconcile load.

Two real console workers (prefork, 2 processes each, as `make run` starts them) side by side
on a scratch database: the *loaded* one holds the inbox consumer's lease — BENCH_NODES
(1,000) enrolled nodes beating every 5 s through the signed channel (sealed with each node's
key onto `npc:inbox`, as agents do: workers/channel.py), handled by the consumer thread in its
main process — and consumes the console queue: the beat schedule (reconcile of
BENCH_DEPLOYMENTS deployments every 5 s, sample flush, offline detection, rollups). The *idle*
one consumes an empty queue; its own inbox consumer thread only polls the lease every second,
as a second console worker's does (it is started once the loaded one holds the lease, and the
CPU each used is printed, so a lease that moved would show). The resident memory of each
worker and its pool processes is sampled every 10 s for BENCH_SECONDS (600). After
BENCH_WARMUP (120 s: registration, caches, first rollups) the loaded worker is "flat" when it grows less than 5% (exit 1 otherwise).

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

    from console.hot import get_redis
    from console.inventory.inbox import LEADER_KEY
    from console.inventory.models import Accelerator

    call_command("migrate", verbosity=0)
    nodes = fleet.enroll_fleet(NODES)
    r = get_redis()
    loaded = fleet.start_worker(SCRATCH.dir / "loaded.log", name="bench-loaded")
    idle = beat = None
    senders = fleet.Senders(nodes)
    rows: list[tuple[float, float, float]] = []
    waiting: list[tuple[float, int]] = []  # (t, inbound messages not yet handled)
    try:
        fleet.wait_worker_ready()
        _wait_lease(r, LEADER_KEY)
        idle = fleet.start_worker(SCRATCH.dir / "idle.log", queue="bench-idle", name="bench-idle")
        beat = fleet.start_beat(SCRATCH.dir / "beat.log", SCRATCH.dir)
        time.sleep(10)  # the idle worker's imports
        cpu0 = fleet.tree_cpu_s(loaded.pid), fleet.tree_cpu_s(idle.pid)
        senders.start()
        t0 = time.monotonic()
        deployed = False
        print(f"{NODES} nodes beating every 5 s + reconcile, {SECONDS:g} s, load {_load()}")
        while (now := time.monotonic() - t0) < SECONDS:
            time.sleep(EVERY - (now % EVERY))
            if not deployed and Accelerator.objects.count() >= NODES * 8:
                _deploy()  # reconcile now has replicas to look at every 5 s
                deployed = True
            a, b = fleet.tree_rss_mb(loaded.pid), fleet.tree_rss_mb(idle.pid)
            rows.append((time.monotonic() - t0, a, b))
            waiting.append((rows[-1][0], fleet.queue_len(r)))
            print(
                f"  t={rows[-1][0]:5.0f} s  loaded {a:7.1f} MiB  idle {b:7.1f} MiB"
                f"  inbox {waiting[-1][1]:6d}"
            )
        sent = senders.sent.value
        cpu = fleet.tree_cpu_s(loaded.pid) - cpu0[0], fleet.tree_cpu_s(idle.pid) - cpu0[1]
    finally:
        senders.stop()
        for p in (beat, loaded, idle):
            if p is not None:
                fleet.stop(p)
        SCRATCH.close()
    steady = [r for r in rows if r[0] >= WARMUP] or rows
    backlog = [(t, n) for t, n in waiting if t >= WARMUP] or waiting
    print(
        f"beats sent: {sent} ({sent / rows[-1][0]:.0f}/s); inbox after warm-up: max "
        f"{max(n for _, n in backlog)}, last {backlog[-1][1]}, slope "
        f"{fleet.slope(backlog):+.2f} msg/s; "
        f"{DEPLOYMENTS} deployments reconciled; CPU loaded {cpu[0]:.0f} s, idle {cpu[1]:.0f} s"
    )
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


def _wait_lease(r, key: str, timeout: float = 30) -> None:
    """Until a consumer (the loaded worker's: the only one running) holds the inbox lease."""
    deadline = time.monotonic() + timeout
    while not r.exists(key):
        if time.monotonic() > deadline:
            raise SystemExit("the loaded worker's inbox consumer never took the lease")
        time.sleep(0.2)


def _deploy() -> None:
    """DEPLOYMENTS running deployments, 2 replicas x 4 NPUs each, on the beating nodes."""
    seeding._deployments(seeding.Scale(deployments=DEPLOYMENTS))


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
