"""Heartbeat ingest soak through the real transport: the signed inbound channel.

BENCH_NODES (10,000) enrolled 8-NPU nodes, each beating every 5 s, spread evenly (2,000
beats/s): a sender process seals each beat with its node's own key and appends it to
`npc:inbox` exactly as an agent does (workers/channel.py). A real console worker (prefork, 2
processes — `make run`'s; its main process runs the inbox consumer) and beat (flush, offline
detection, rollups, reconcile) consume them against a scratch database (SQLite, or
BENCH_DATABASE_URL) and Redis (embedded, or BENCH_REDIS_URL). Every 5 s the inbound queue's
length is sampled. Prints beats/s sent vs needed, the queue's slope after warm-up, the
worker's CPU per beat, and exit status 1 if the queue grows. Each sample also reads the
dashboard's fleet totals, as an open dashboard polls them (every beat pays for the sums).

Then, in this process, the same sealed beats through Inbox.handle_batch with and without
authentication (the HMAC, credential, window and sequence checks) timed side by side: the
authentication share of the per-beat CPU.

    .venv/bin/python bench/heartbeat_soak.py                 # 300 s, 10,000 nodes
    BENCH_SECONDS=60 BENCH_NODES=4000 .venv/bin/python bench/heartbeat_soak.py
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
NODES = int(os.environ.get("BENCH_NODES", "10000"))
INTERVAL = 5.0
WARMUP = float(os.environ.get("BENCH_WARMUP", "30"))


def main() -> int:
    from django.core.management import call_command

    from console.hot import get_redis
    from console.inventory.models import Node
    from console.telemetry.services import fleet_totals

    call_command("migrate", verbosity=0)
    nodes = fleet.enroll_fleet(NODES)
    t = time.monotonic()
    fleet.register_fleet(nodes)  # each node's first beat (NPU rows, online): not the steady state
    print(f"{NODES} nodes enrolled and registered in {time.monotonic() - t:.0f} s")
    r = get_redis()
    log = SCRATCH.dir / "worker.log"
    worker = fleet.start_worker(log)
    beat = fleet.start_beat(SCRATCH.dir / "beat.log", SCRATCH.dir)
    senders = fleet.Senders(nodes)
    samples: list[tuple[float, int, int]] = []  # (t, queue length, beats sent so far)
    try:
        fleet.wait_worker_ready()
        cpu0 = fleet.tree_cpu_s(worker.pid)
        parts0 = fleet.cpu_parts(worker.pid, senders.proc.pid if senders.proc.pid else None)
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
        parts = fleet.cpu_parts(worker.pid, senders.proc.pid)
        elapsed = time.monotonic() - t0
    finally:
        senders.stop()
        fleet.stop(beat)
        fleet.stop(worker)
    registered = Node.objects.filter(name__startswith="bench-").count()
    online = Node.objects.filter(name__startswith="bench-", status="online").count()
    refused = r.hgetall("npc:refusals")
    auth_share = authentication_share(nodes[:2000])
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
        f"inbound queue after {WARMUP:g} s warm-up: max "
        f"{max(n for _, n, _ in steady)}, last {last}, slope {growth:+.3f} msg/s -> "
        f"{'GROWS' if grows else 'does not grow'}"
    )
    print(
        f"console worker CPU: {cpu / elapsed:.2f} cores busy of {os.cpu_count()} "
        f"({1000 * cpu / max(samples[-1][2], 1):.3f} ms CPU per beat, all included); "
        f"{registered} nodes registered, {online} online; refused {refused or 'none'}; "
        f"load {_load()}"
    )
    spent = {k: parts[k] - parts0.get(k, 0.0) for k in parts}
    beats = max(samples[-1][2], 1)
    print(
        "cores busy by part: "
        + ", ".join(
            f"{k} {v / elapsed:.2f} ({1e3 * v / beats:.3f} ms/beat)" for k, v in spent.items()
        )
    )
    print(
        f"authentication: {auth_share[0]:.1f} us of {auth_share[1]:.1f} us per beat in-process "
        f"= {100 * auth_share[0] / auth_share[1]:.1f} % of the per-beat CPU"
    )
    return 1 if grows or online != NODES else 0


def authentication_share(nodes: list, rounds: int = 3) -> tuple[float, float]:
    """(µs of authentication, µs of the whole inbox path) per beat, measured side by side on
    the same sealed beats: Inbox.authenticate alone vs Inbox.handle_batch."""
    from bench.seed import heartbeat_doc
    from console.inventory.inbox import Inbox
    from workers import channel

    inbox = Inbox()
    auth, whole = [], []
    for _ in range(rounds):
        raws = [
            channel.seal(
                bytes.fromhex(key),
                {"v": 1, "n": n, "kid": kid, "k": "console.heartbeat", "t": time.time()}
                | {"s": time.time_ns(), "b": heartbeat_doc(n, 8)},
            )
            for n, kid, key in nodes
        ]
        inbox.last_seq.clear()
        t = time.perf_counter()
        for raw in raws:
            inbox.authenticate(raw, time.time())
        auth.append((time.perf_counter() - t) / len(raws))
        inbox.last_seq.clear()
        t = time.perf_counter()
        inbox.handle_batch(raws)
        whole.append((time.perf_counter() - t) / len(raws))
    return 1e6 * min(auth), 1e6 * min(whole)


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())
