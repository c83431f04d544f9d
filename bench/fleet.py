"""Shared parts of the soak benches: real console worker / beat processes, a process that
beats for N simulated nodes through Celery the way agents do, and the console queue length.

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
    """Messages waiting on the console queue (kombu keeps one Redis list per priority)."""
    return sum(r.llen(k) for k in r.scan_iter(match=f"{CONSOLE_QUEUE}*") if r.type(k) == b"list")


def _beat_loop(url: str, token: str, nodes: int, npus: int, interval: float, sent, stop_at):
    """Every node beats once per `interval`, spread evenly over it (node i at offset i/n)."""
    from celery import Celery

    app = Celery("bench-agents", broker=url)
    app.conf.update(task_serializer="json", broker_connection_retry_on_startup=True)
    docs = [heartbeat_doc(f"bench-{n:04d}", npus, token=token) for n in range(nodes)]
    step = interval / nodes
    t0 = time.monotonic()
    k = 0
    with app.producer_pool.acquire(block=True) as producer:
        while time.monotonic() < stop_at.value:
            for n, doc in enumerate(docs):
                due = t0 + k * interval + n * step
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                for chip in doc["chips"]:  # vary the values as real chips do
                    chip["aicore_percent"] = float((k * 7 + n + chip["npu_id"]) % 100)
                doc["sent_at"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
                app.send_task(
                    "console.heartbeat",
                    args=[doc],
                    queue=CONSOLE_QUEUE,
                    ignore_result=True,
                    producer=producer,
                )
                with sent.get_lock():
                    sent.value += 1
            k += 1


class Senders:
    """A separate process beating for `nodes` nodes every `interval` s until stopped."""

    def __init__(self, token: str, nodes: int, npus: int = 8, interval: float = 5.0) -> None:
        ctx = mp.get_context("spawn")
        self.sent = ctx.Value("q", 0)
        self.stop_at = ctx.Value("d", float("inf"))
        self.proc = ctx.Process(
            target=_beat_loop,
            args=(broker_url(), token, nodes, npus, interval, self.sent, self.stop_at),
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
