"""Telemetry ingest throughput: record_heartbeat and the inbox path vs. bare Redis round trips.

1,000 enrolled nodes x 8 NPUs. Side by side in the same run, rounds alternating so all see the
same machine:
- console.telemetry.services.record_heartbeat (in-process): the telemetry hot store alone;
- the same beats sealed with each node's own key (workers/channel.py) through
  Inbox.handle_batch, the inbox consumer's whole per-beat path (authentication, validation,
  node state, telemetry), and Inbox.authenticate alone (MAC, credential, window, sequence);
- the baseline: the same bytes with a plain SET+RPUSH pipeline per beat and no encoding.

    .venv/bin/python bench/heartbeat_ingest.py

Prints beats/s for each, the ratios to the baseline, and the Redis memory a buffered beat
takes. A scratch SQLite database holds the nodes' credentials (BENCH_DATABASE_URL for
another); Redis is an embedded one (BENCH_REDIS_URL for another: the telemetry keys are then
under a private prefix, deleted at the end).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import seed as seeding  # noqa: E402

SCRATCH = seeding.setup_django() if __name__ == "__main__" else None

from django.conf import settings  # noqa: E402

from bench import fleet, inbox_path  # noqa: E402
from console.hot import get_redis  # noqa: E402
from console.telemetry import services  # noqa: E402
from workers.contracts import Heartbeat  # noqa: E402

NODES = 1_000
NPUS = 8
ROUNDS = 5  # of NODES beats each, per contender


def make_beats(names: list[str], at: datetime) -> list[Heartbeat]:
    beats = []
    for n, name in enumerate(names):
        chips = [
            {
                "npu_id": i, "chip_id": 0, "name": "910B3", "health": "OK",
                "power_w": 90.0 + n % 7 + i, "temperature_c": 40.0 + i,
                "aicore_percent": float((n * 7 + i * 13) % 101), "memory_used_mb": 2_100,
                "memory_total_mb": 15_039, "hbm_used_mb": 30_000 + 37 * i,
                "hbm_total_mb": 65_536, "bus_id": f"0000:{0xC1 + i:02X}:00.0",
                "phy_id": i, "logic_id": i,
            }
            for i in range(NPUS)
        ]  # fmt: skip
        processes = [{"npu_id": i, "chip_id": 0, "pid": 1000 + i, "name": "vllm"} for i in range(2)]
        beats.append(
            Heartbeat.model_validate(
                {
                    "node": name,
                    "sent_at": at.isoformat(),
                    "chips": chips,
                    "processes": processes,
                }
            )
        )
    return beats


def run_record(beats: list[Heartbeat], ids: dict[str, int], at: datetime) -> float:
    """Seconds for one beat of every node through record_heartbeat."""
    start = time.perf_counter()
    for hb in beats:
        services.record_heartbeat(node_id=ids[hb.node], node_name=hb.node, received_at=at, hb=hb)
    return time.perf_counter() - start


def run_baseline(r, docs: list[tuple[str, bytes, bytes]]) -> float:
    """Seconds for the same writes as bare pipelines (SET EX + RPUSH), pre-encoded."""
    samples = services.samples_key()
    ttl = int(settings.HEARTBEAT_INTERVAL_S * services.LATEST_TTL_BEATS)
    start = time.perf_counter()
    for key, doc, row in docs:
        pipe = r.pipeline(transaction=False)
        pipe.set(key, doc, ex=ttl)
        pipe.rpush(samples, row)
        pipe.execute()
    return time.perf_counter() - start


def main() -> None:
    from django.core.management import call_command

    if os.environ.get("BENCH_REDIS_URL"):
        services.KEY_PREFIX = f"npc:bench-{os.getpid()}:"
    r = get_redis()
    try:
        call_command("migrate", verbosity=0)
        report(r)
    finally:
        if services.KEY_PREFIX != "npc:":
            keys = list(r.scan_iter(f"{services.KEY_PREFIX}*"))
            if keys:
                r.delete(*keys)
        SCRATCH.close()


def report(r) -> None:
    from console.inventory.inbox import Inbox
    from console.inventory.models import Node

    nodes = fleet.enroll_fleet(NODES)
    ids = dict(Node.objects.values_list("name", "pk"))
    at = datetime.now(UTC)
    beats = make_beats([name for name, _, _ in nodes], at)
    t = time.perf_counter()
    payloads = [hb.model_dump(mode="json") for hb in beats]
    [Heartbeat.model_validate(p) for p in payloads]
    validate_s = (time.perf_counter() - t) / NODES
    bodies = [(hb.node, p) for hb, p in zip(beats, payloads, strict=True)]

    run_record(beats, ids, at)  # warm-up, and the bytes the baseline will send
    docs = [(services.latest_key(hb.node), r.get(services.latest_key(hb.node))) for hb in beats]
    rows = r.lrange(services.samples_key(), 0, NODES - 1)
    memory = r.memory_usage(services.samples_key()) or 0
    baseline_docs = [(k, d, row) for (k, d), row in zip(docs, rows, strict=True)]
    r.delete(services.samples_key())
    inbox, auth_inbox = Inbox(), Inbox()
    inbox_path.handle(inbox, inbox_path.sealed(nodes, bodies))  # registration: not timed
    inbox_path.authenticate(auth_inbox, inbox_path.sealed(nodes, bodies))

    rec, base, whole, auth = [], [], [], []
    for round_no in range(ROUNDS):
        raws, auth_raws = inbox_path.sealed(nodes, bodies), inbox_path.sealed(nodes, bodies)
        base.append(NODES / run_baseline(r, baseline_docs))
        rec.append(NODES / run_record(beats, ids, at + timedelta(seconds=5 * (round_no + 1))))
        whole.append(NODES / inbox_path.handle(inbox, raws))
        auth.append(NODES / inbox_path.authenticate(auth_inbox, auth_raws))
        r.delete(services.samples_key())
    rec_rate, base_rate = statistics.median(rec), statistics.median(base)
    whole_rate, auth_rate = statistics.median(whole), statistics.median(auth)
    where = settings.REDIS_URL if os.environ.get("BENCH_REDIS_URL") else "embedded (unix socket)"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"redis: {where}; {NODES} nodes x {NPUS} NPUs; {ROUNDS} rounds; {os.cpu_count()} CPUs; "
          f"load {load}")  # fmt: skip
    print(f"latest doc: {len(docs[0][1])} B/node; buffered row: {len(rows[0])} B/beat; "
          f"buffer memory: {memory / NODES:.0f} B/beat")  # fmt: skip
    for name, rate in (
        ("record_heartbeat:", rec_rate),
        ("inbox handle_batch:", whole_rate),
        ("  authenticate alone:", auth_rate),
        ("bare SET+RPUSH pipeline:", base_rate),
    ):
        print(f"{name:24s} {rate:8,.0f} beats/s  ({1e6 / rate:6.1f} us/beat)")
    print(f"ratio record/bare:       {rec_rate / base_rate:8.2f}")
    print(f"ratio inbox/bare:        {whole_rate / base_rate:8.2f}")
    print(f"(payload validation, inside handle_batch: {validate_s * 1e6:.1f} us/beat)")


if __name__ == "__main__":
    main()
