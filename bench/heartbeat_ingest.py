"""Telemetry ingest throughput: record_heartbeat vs. the bare Redis round trips it makes.

1,000 simulated nodes x 8 NPUs send heartbeats through
console.telemetry.services.record_heartbeat (in-process), against the Redis at REDIS_URL or an
embedded one. Side by side in the same run, the baseline sends the same bytes with a plain
SET+RPUSH pipeline per beat and no encoding. Rounds alternate so both see the same machine.

    DJANGO_SETTINGS_MODULE=console.settings .venv/bin/python bench/heartbeat_ingest.py

Prints beats/s for both, the ratio, and the Redis memory a buffered beat takes. Touches no
database; its Redis keys are under a private prefix, deleted at the end.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from console import embedded_redis  # noqa: E402
from console.hot import get_redis  # noqa: E402
from console.telemetry import services  # noqa: E402
from workers.contracts import Heartbeat  # noqa: E402

NODES = 1_000
NPUS = 8
ROUNDS = 5  # of NODES beats each, per contender


def make_beats(at: datetime) -> list[Heartbeat]:
    beats = []
    for n in range(NODES):
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
                    "node": f"bench-{n:04d}",
                    "enroll_token": "bench-enroll-token",
                    "sent_at": at.isoformat(),
                    "chips": chips,
                    "processes": processes,
                }
            )
        )
    return beats


def run_record(beats: list[Heartbeat], at: datetime) -> float:
    """Seconds for one beat of every node through record_heartbeat."""
    start = time.perf_counter()
    for i, hb in enumerate(beats):
        services.record_heartbeat(node_id=i + 1, node_name=hb.node, received_at=at, hb=hb)
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
    tmp = proc = None
    if not os.environ.get("REDIS_URL"):
        tmp = Path(tempfile.mkdtemp(prefix="npc-bench-"))
        proc = embedded_redis.start(tmp / "redis.sock", tmp)
        settings.REDIS_URL = f"unix://{tmp / 'redis.sock'}"
    services.KEY_PREFIX = f"npc:bench-{os.getpid()}:"
    r = get_redis()
    try:
        report(r)
    finally:
        keys = list(r.scan_iter(f"{services.KEY_PREFIX}*"))
        if keys:
            r.delete(*keys)
        if proc is not None:
            embedded_redis.stop(proc)
            shutil.rmtree(tmp, ignore_errors=True)


def report(r) -> None:
    at = datetime.now(UTC)
    beats = make_beats(at)
    t = time.perf_counter()
    payloads = [hb.model_dump(mode="json") for hb in beats]
    [Heartbeat.model_validate(p) for p in payloads]
    validate_s = (time.perf_counter() - t) / NODES

    run_record(beats, at)  # warm-up, and the bytes the baseline will send
    docs = [(services.latest_key(hb.node), r.get(services.latest_key(hb.node))) for hb in beats]
    rows = r.lrange(services.samples_key(), 0, NODES - 1)
    memory = r.memory_usage(services.samples_key()) or 0
    baseline_docs = [(k, d, row) for (k, d), row in zip(docs, rows, strict=True)]
    r.delete(services.samples_key())

    rec, base = [], []
    for round_no in range(ROUNDS):
        base.append(NODES / run_baseline(r, baseline_docs))
        rec.append(NODES / run_record(beats, at + timedelta(seconds=5 * (round_no + 1))))
        r.delete(services.samples_key())
    rec_rate, base_rate = statistics.median(rec), statistics.median(base)
    where = settings.REDIS_URL if os.environ.get("REDIS_URL") else "embedded (unix socket)"
    print(f"redis: {where}; {NODES} nodes x {NPUS} NPUs; {ROUNDS} rounds; {os.cpu_count()} CPUs")
    print(f"latest doc: {len(docs[0][1])} B/node; buffered row: {len(rows[0])} B/beat; "
          f"buffer memory: {memory / NODES:.0f} B/beat")  # fmt: skip
    print(f"record_heartbeat:        {rec_rate:8,.0f} beats/s  ({1e6 / rec_rate:6.1f} us/beat)")
    print(f"bare SET+RPUSH pipeline: {base_rate:8,.0f} beats/s  ({1e6 / base_rate:6.1f} us/beat)")
    print(f"ratio record/bare:       {rec_rate / base_rate:8.2f}")
    print(f"(payload validation, paid by the Celery task before: {validate_s * 1e6:.1f} us/beat)")


if __name__ == "__main__":
    main()
