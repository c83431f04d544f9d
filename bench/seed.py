"""A seeded scratch database at fleet scale, for the scale benches (bench/page_latency.py …).

1,000 nodes x 8 NPUs, 500 deployments (2 replicas x 4 NPUs each, every allocation a real
NpuAllocation row: half the fleet's NPUs are booked), 3,000 incidents, 10,000 audit entries,
the latest heartbeat of every node in the hot store, and 30 days of telemetry rollups.

Rollups: 30 days of **1-hour** rollups for every NPU (8,000 x 720 = 5.76 M rows) plus
**1-minute** rollups for the last BENCH_MINUTE_HOURS hours only (default 1: 480,000 rows).
Thirty days of 1-minute rollups would be 345 M rows — more than this machine's disk and
time allow — so they are not seeded, and the output says so.

The database is a SQLite file under a temporary directory, or BENCH_DATABASE_URL when given
(never DATABASE_URL: the user's own database is never touched). Redis is an embedded one
in the same temporary directory, or BENCH_REDIS_URL. Sizes come from BENCH_NODES,
BENCH_NPUS, BENCH_DEPLOYMENTS, BENCH_INCIDENTS, BENCH_ROLLUP_DAYS, BENCH_MINUTE_HOURS.

    .venv/bin/python bench/seed.py            # seed, print the time, delete
    .venv/bin/python bench/seed.py --keep DIR # seed into DIR/bench.sqlite3 and keep it

Benches import it: `scratch = bench.seed.setup_django()` before any Django import, then
`bench.seed.seed()` (or reuse a kept DIR with BENCH_SEEDED_DIR).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Scale:
    nodes: int = int(os.environ.get("BENCH_NODES", "1000"))
    npus: int = int(os.environ.get("BENCH_NPUS", "8"))
    deployments: int = int(os.environ.get("BENCH_DEPLOYMENTS", "500"))
    incidents: int = int(os.environ.get("BENCH_INCIDENTS", "3000"))
    audit: int = int(os.environ.get("BENCH_AUDIT", "10000"))
    rollup_days: int = int(os.environ.get("BENCH_ROLLUP_DAYS", "30"))
    minute_hours: int = int(os.environ.get("BENCH_MINUTE_HOURS", "1"))
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class Scratch:
    dir: Path
    database_url: str
    redis_url: str
    keep: bool
    redis_proc: object = None

    def close(self) -> None:
        from console import embedded_redis

        if self.redis_proc is not None:
            embedded_redis.stop(self.redis_proc)
            self.redis_proc = None
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def setup_django(keep_dir: str | None = None) -> Scratch:
    """Point Django at a scratch database and Redis, then django.setup(). Call first."""
    keep_dir = keep_dir or os.environ.get("BENCH_SEEDED_DIR")
    scratch = Path(keep_dir) if keep_dir else Path(tempfile.mkdtemp(prefix="npc-scale-"))
    scratch.mkdir(parents=True, exist_ok=True)
    db = os.environ.get("BENCH_DATABASE_URL") or f"sqlite:///{scratch / 'bench.sqlite3'}"
    os.environ["DATABASE_URL"] = db
    sock = scratch / "redis.sock"
    redis_url = os.environ.get("BENCH_REDIS_URL") or f"unix://{sock}"
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-0123456789")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    out = Scratch(dir=scratch, database_url=db, redis_url=redis_url, keep=bool(keep_dir))
    if not os.environ.get("BENCH_REDIS_URL"):
        from console import embedded_redis

        out.redis_proc = embedded_redis.start(sock, scratch)
    return out


def is_seeded() -> bool:
    from console.inventory.models import Node

    try:
        return Node.objects.exists()
    except Exception:  # noqa: BLE001 - no tables yet
        return False


def seed(scale: Scale | None = None, *, log=print) -> Scale:
    """Migrate and fill the scratch database; returns the scale with seconds per step."""
    from django.core.management import call_command

    scale = scale or Scale()
    steps = [
        ("migrate", lambda: call_command("migrate", verbosity=0)),
        ("nodes+npus", lambda: _nodes(scale)),
        ("deployments", lambda: _deployments(scale)),
        ("incidents+audit", lambda: _incidents(scale)),
        ("hot store", lambda: _hot(scale)),
        ("rollups 1h", lambda: _rollups(scale, 3600, scale.rollup_days * 24, log)),
        ("rollups 1m", lambda: _rollups(scale, 60, scale.minute_hours * 60, log)),
    ]
    for name, fn in steps:
        t0 = time.perf_counter()
        fn()
        scale.timings[name] = time.perf_counter() - t0
        log(f"  seeded {name:16s} {scale.timings[name]:7.1f} s")
    return scale


def _nodes(scale: Scale) -> None:
    from django.utils import timezone

    from console.inventory.models import Accelerator, Node

    now = timezone.now()
    nodes = [
        Node(
            name=f"kp-{n:04d}",
            hostname=f"kp-{n:04d}.dc1",
            address=f"10.{n // 250}.{n % 250}.10",
            arch="aarch64",
            cpu_model="Kunpeng 920 (HiSilicon TSV110)",
            cpu_cores=192,
            memory_mb=1_536_000,
            npu_driver_version="24.1.rc2",
            cann_version="8.0.RC3",
            labels={"zone": f"az{n % 3 + 1}", "rack": f"r{n // 20:02d}"},
            status="online" if n % 50 else "offline",
            last_heartbeat=now,
        )
        for n in range(scale.nodes)
    ]
    Node.objects.bulk_create(nodes, batch_size=500)
    ids = dict(Node.objects.values_list("name", "id"))
    accs = [
        Accelerator(
            node_id=ids[f"kp-{n:04d}"],
            npu_id=i,
            chip_id=0,
            model_name="910B3",
            hbm_total_mb=65536,
            health="OK" if (n * scale.npus + i) % 97 else "Warning",
            bus_id=f"0000:{0xC1 + i:02X}:00.0",
        )
        for n in range(scale.nodes)
        for i in range(scale.npus)
    ]
    Accelerator.objects.bulk_create(accs, batch_size=1000)


def _deployments(scale: Scale) -> None:
    from console.deployments.models import Deployment, NpuAllocation, Replica

    deps = [
        Deployment(
            name=f"dep-{d:03d}",
            model_path=f"/models/DeepSeek-R1-Distill-Qwen-{(7, 14, 32)[d % 3]}B",
            served_model_name=f"r1-distill-{d:03d}",
            tensor_parallel_size=4,
            npus_per_replica=4,
            replicas=2,
            desired_state="running",
        )
        for d in range(scale.deployments)
    ]
    Deployment.objects.bulk_create(deps, batch_size=500)
    dep_ids = list(Deployment.objects.order_by("name").values_list("id", flat=True))
    node_ids = list(_node_ids())
    replicas = []
    for d, dep_id in enumerate(dep_ids):
        for k in range(2):
            n = (2 * d + k) % len(node_ids)
            replicas.append(
                Replica(
                    deployment_id=dep_id,
                    index=k,
                    node_id=node_ids[n],
                    port=8100 + (2 * d + k) // len(node_ids),
                    state="ready" if d % 10 else "failed",
                    spec_version=1,
                )
            )
    Replica.objects.bulk_create(replicas, batch_size=500)
    accs = _accelerators_by_node()
    allocs = []
    for r in Replica.objects.values("id", "node_id", "port"):
        slot = (r["port"] - 8100) * 4
        for acc_id in accs[r["node_id"]][slot : slot + 4]:
            allocs.append(NpuAllocation(accelerator_id=acc_id, replica_id=r["id"]))
    NpuAllocation.objects.bulk_create(allocs, batch_size=1000)


def _node_ids() -> list[int]:
    from console.inventory.models import Node

    return list(Node.objects.order_by("name").values_list("id", flat=True))


def _accelerators_by_node() -> dict[int, list[int]]:
    from console.inventory.models import Accelerator

    out: dict[int, list[int]] = {}
    for node_id, acc_id in Accelerator.objects.order_by("node_id", "npu_id").values_list(
        "node_id", "id"
    ):
        out.setdefault(node_id, []).append(acc_id)
    return out


def _incidents(scale: Scale) -> None:
    from django.utils import timezone

    from console.accounts.models import AuditEntry
    from console.deployments.models import Replica
    from console.diagnosis.models import Incident

    now = timezone.now()
    node_ids = _node_ids()
    accs = _accelerators_by_node()
    replica_ids = list(Replica.objects.values_list("id", flat=True))
    rows = []
    for i in range(scale.incidents):
        node_id = node_ids[i % len(node_ids)]
        kind = i % 3
        rows.append(
            Incident(
                category=("engine.oom", "npu.health", "npu.temperature")[kind],
                severity=("critical", "warning", "info")[i % 3],
                title=f"incident {i}",
                status=("open", "acknowledged", "resolved", "resolved")[i % 4],
                fingerprint=f"bench:{i}",
                count=1 + i % 7,
                first_seen=now - timedelta(minutes=i),
                last_seen=now - timedelta(seconds=i * 20),
                node_id=node_id,
                replica_id=replica_ids[i % len(replica_ids)] if kind == 0 else None,
                accelerator_id=accs[node_id][i % len(accs[node_id])] if kind else None,
                subject=f"subject {i}",
            )
        )
    Incident.objects.bulk_create(rows, batch_size=500)
    AuditEntry.objects.bulk_create(
        [
            AuditEntry(
                actor="bench",
                via="system",
                action="node.set_status",
                object_type="inventory.node",
                object_id=str(node_ids[i % len(node_ids)]),
                object_repr=f"kp-{i % len(node_ids):04d}",
                message="seeded",
            )
            for i in range(scale.audit)
        ],
        batch_size=1000,
    )


def heartbeat_doc(name: str, npus: int, k: int = 0) -> dict:
    """A heartbeat like an 8-NPU 910B3 agent's, varying with `k`."""
    return {
        "node": name,
        "sent_at": datetime.now(UTC).isoformat(),
        "host": {"hostname": name, "arch": "aarch64"},
        "chips": [
            {
                "npu_id": i,
                "chip_id": 0,
                "name": "910B3",
                "health": "OK",
                "power_w": 90.0 + i,
                "temperature_c": 40.0 + (i + k) % 30,
                "aicore_percent": float((i * 13 + k) % 100),
                "hbm_used_mb": 30_000,
                "hbm_total_mb": 65_536,
                "bus_id": f"0000:{0xC1 + i:02X}:00.0",
            }
            for i in range(npus)
        ],
    }


def _hot(scale: Scale) -> None:
    from django.utils import timezone

    from console.hot import get_redis
    from console.inventory.models import Node
    from console.telemetry.services import record_heartbeat
    from workers.contracts import Heartbeat

    now = timezone.now()
    pipe = get_redis().pipeline(transaction=False)
    for node_id, name in Node.objects.values_list("id", "name"):
        hb = Heartbeat.model_validate(heartbeat_doc(name, scale.npus))
        record_heartbeat(node_id=node_id, node_name=name, received_at=now, hb=hb, pipe=pipe)
    pipe.execute()
    # the raw-sample buffer is not what the pages read; keep the store small
    get_redis().delete("npc:samples")


def _rollups(scale: Scale, resolution: int, buckets: int, log) -> None:
    """`buckets` buckets of `resolution` seconds back from now for every chip, inserted with
    executemany in one transaction per 50,000 rows (the ORM's per-object cost would dominate)."""
    from django.db import connection, transaction

    from console.telemetry.models import ChipRollup

    chips = [
        (node_id, i)
        for node_id in _node_ids()
        for i in range(scale.npus)  # npu ids are 0..npus-1 on every node
    ]
    table = connection.ops.quote_name(ChipRollup._meta.db_table)
    cols = (
        "resolution, bucket, node_id, npu_id, chip_id, aicore_avg, aicore_max, hbm_used_avg, "
        "hbm_used_max, hbm_total_mb, temperature_avg, temperature_max, power_avg, "
        "health_worst, samples"
    )
    sql = f"INSERT INTO {table} ({cols}) VALUES ({', '.join(['%s'] * 15)})"
    end = datetime.fromtimestamp(int(time.time()) // resolution * resolution, tz=UTC)
    per_bucket = resolution // 5
    batch: list[tuple] = []
    total = 0
    t0 = time.perf_counter()

    def flush() -> None:
        with transaction.atomic(), connection.cursor() as cur:
            cur.executemany(sql, batch)
        batch.clear()

    for b in range(buckets, 0, -1):
        bucket = end - timedelta(seconds=resolution * b)
        for node_id, npu in chips:
            u = float((node_id * 7 + npu * 13 + b) % 100)
            batch.append(
                (resolution, bucket, node_id, npu, 0, u, min(100.0, u + 9), 30000.0, 31000)
                + (65536, 45.0 + npu, 51.0 + npu, 180.0, 0, per_bucket)
            )
            if len(batch) >= 50_000:
                total += len(batch)
                flush()
        if b % 48 == 0 and total:
            log(
                f"    {resolution}s rollups: {total:,} rows, {total / (time.perf_counter() - t0):,.0f}/s"
            )
    total += len(batch)
    if batch:
        flush()
    log(f"    {resolution}s rollups: {total:,} rows")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", metavar="DIR", help="seed into DIR and keep it")
    args = ap.parse_args()
    scratch = setup_django(args.keep)
    try:
        if is_seeded():
            print(f"{scratch.database_url} is already seeded")
            return
        scale = Scale()
        print(
            f"seeding {scratch.database_url}: {scale.nodes} nodes x {scale.npus} NPUs, "
            f"{scale.deployments} deployments, {scale.incidents} incidents, "
            f"{scale.rollup_days} days of 1h rollups + {scale.minute_hours} h of 1m rollups "
            f"(30 days of 1m rollups, {scale.nodes * scale.npus * 43200:,} rows, not seeded)"
        )
        t0 = time.perf_counter()
        seed(scale)
        print(f"seeded in {time.perf_counter() - t0:.1f} s ({os.cpu_count()} CPUs)")
    finally:
        scratch.close()


if __name__ == "__main__":
    main()
