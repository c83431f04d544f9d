"""Shared parts of the soak benches: real console worker / beat processes, a process that
beats for N simulated nodes through the signed channel the way agents do, and the inbound
queue's length.

Import after bench.seed.setup_django() (the children inherit DATABASE_URL and REDIS_URL).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.seed import ROOT, heartbeat_doc

CONSOLE_QUEUE = "console"


def broker_url() -> str:
    return os.environ["REDIS_URL"].replace("unix://", "redis+socket://", 1)


def start_worker(
    log: Path, *, queue: str = CONSOLE_QUEUE, concurrency: int = 2, name: str = "bench"
) -> subprocess.Popen:
    """A console Celery worker as `make run` starts it (prefork, `concurrency` processes)."""
    argv = [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", queue]
    argv += ["--concurrency", str(concurrency), "-n", f"{name}@%h", "-l", "warning"]
    argv += ["--without-gossip", "--without-mingle"]
    return _spawn(argv, log)


def start_beat(log: Path, scratch: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "celery", "-A", "console", "beat", "-l", "warning"]
    argv += ["-s", str(scratch / "celerybeat-schedule")]
    return _spawn(argv, log)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM the process (Celery's warm shutdown), SIGKILL its group after `timeout`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(5)


def wait_worker_ready(timeout: float = 90) -> None:
    """Until a console worker answers console.ping (its imports and Django are loaded)."""
    from console.celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            app.send_task("console.ping", args=["ready"], queue=CONSOLE_QUEUE).get(timeout=3)
            return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.5)
    raise SystemExit("the console worker did not answer within the timeout")


def queue_len(r) -> int:
    """Messages waiting on the inbound channel (the inbox and the batch being handled)."""
    from console.inventory.inbox import PROCESSING_KEY
    from workers.channel import INBOX_KEY

    return r.llen(INBOX_KEY) + r.llen(PROCESSING_KEY)


def enroll_fleet(nodes: int, prefix: str = "bench") -> list[tuple[str, int, str]]:
    """Register `nodes` nodes with a credential each, in bulk (set-up only: an agent enrolls
    through console/inventory/identity.py). Returns (name, credential id, key hex) per node."""
    from console.inventory.identity import bump_version, node_key
    from console.inventory.models import Node, NodeCredential
    from workers import channel

    names = [f"{prefix}-{n:05d}" for n in range(nodes)]
    Node.objects.bulk_create(
        [Node(name=n, hostname=n) for n in names], batch_size=1000, ignore_conflicts=True
    )
    ids = dict(Node.objects.filter(name__in=names).values_list("name", "pk"))
    NodeCredential.objects.bulk_create(
        [NodeCredential(node_id=ids[n], issued_via="bench") for n in names], batch_size=1000
    )
    out = []
    for pk, name in NodeCredential.objects.filter(node__name__in=names).values_list(
        "pk", "node__name"
    ):
        out.append((name, pk, node_key(name, pk).hex()))
    NodeCredential.objects.filter(pk__in=[kid for _, kid, _ in out]).update(fingerprint="bench")
    bump_version()
    del channel
    return sorted(out)


def register_fleet(fleet: list, npus: int = 8) -> None:
    """Each node's first beat, in-process: its NPU rows, online. What a running console has
    done long before a soak's steady state."""
    from console.inventory.inbox import Inbox
    from workers import channel

    inbox = Inbox()
    for i in range(0, len(fleet), 500):
        raws = [
            channel.seal(
                bytes.fromhex(key),
                {"v": 1, "n": n, "kid": kid, "k": "console.heartbeat", "t": time.time()}
                | {"s": time.time_ns() // 1000, "b": heartbeat_doc(n, npus)},
            )
            for n, kid, key in fleet[i : i + 500]
        ]
        inbox.handle_batch(raws)


def cpu_parts(worker_pid: int, sender_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of: the worker's main process (the inbox consumer), its pool
    children, the sender, and every redis-server (embedded or local)."""
    import psutil

    def cpu(p) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except psutil.NoSuchProcess:
            return 0.0

    out: dict[str, float] = {}
    try:
        main = psutil.Process(worker_pid)
        out["inbox consumer"] = cpu(main)  # + the worker's idle main loop
        out["worker pool"] = sum(cpu(c) for c in main.children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    if sender_pid:
        out["sender"] = cpu(psutil.Process(sender_pid))
    out["redis"] = sum(
        cpu(p) for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("redis")
    )
    return out


def _beat_loop(url: str, fleet: list, npus: int, interval: float, sent, stop_at):
    """Every node beats once per `interval`, spread evenly over it (node i at offset i/n),
    sealed with its own key and appended to the inbox as an agent does (the sender pipelines
    the beats due in the same few milliseconds: it stands in for many hosts)."""
    import redis

    from workers import channel

    r = redis.Redis.from_url(url)
    agents = [
        (channel.AgentChannel(r, channel.Identity(n, kid, key)), heartbeat_doc(n, npus))
        for n, kid, key in fleet
    ]
    step = interval / len(agents)
    t0 = time.monotonic()
    k = 0
    while time.monotonic() < stop_at.value:
        n = 0
        while n < len(agents) and time.monotonic() < stop_at.value:
            due = t0 + k * interval + n * step
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pipe = r.pipeline(transaction=False)
            burst = 0
            while n < len(agents) and t0 + k * interval + n * step <= time.monotonic() + 0.005:
                agent, doc = agents[n]
                for chip in doc["chips"]:  # vary the values as real chips do
                    chip["aicore_percent"] = float((k * 7 + n + chip["npu_id"]) % 100)
                doc["sent_at"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
                agent.r = pipe
                agent.send("console.heartbeat", doc)
                n += 1
                burst += 1
            pipe.execute()
            with sent.get_lock():
                sent.value += burst
        k += 1


class Senders:
    """A separate process beating for `nodes` nodes every `interval` s until stopped."""

    def __init__(self, fleet: list, npus: int = 8, interval: float = 5.0) -> None:
        ctx = mp.get_context("spawn")
        self.sent = ctx.Value("q", 0)
        self.stop_at = ctx.Value("d", float("inf"))
        self.proc = ctx.Process(
            target=_beat_loop,
            args=(os.environ["REDIS_URL"], fleet, npus, interval, self.sent, self.stop_at),
            daemon=True,
        )

    def start(self) -> None:
        self.proc.start()

    def stop(self) -> None:
        self.stop_at.value = 0.0
        self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (a prefork worker and its pool), MiB."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live children."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y) points, y per second."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else 0.0
