"""p95 latency of the fleet pages on a seeded 1,000-node fleet vs. a trivial Django view.

A real uvicorn (one process, as `make run` starts it) serves the console over the scratch
database of bench/seed.py (1,000 nodes x 8 NPUs, 500 deployments, 3,000 incidents, 30 days
of rollups, live telemetry for every node in Redis). A signed-in viewer requests the
dashboard, the node list, the deployment list and the incident queue — full pages and the
htmx partials they poll every 5 s — interleaved round by round with `/bench/trivial`, a view
that only returns "ok" through the same middleware (session, user, CSRF; see
bench/scale_urls.py). Prints each page's p50/p95, the trivial view's, and p95 / trivial p95
(target <= 3x). Exit status 1 when a page is over BENCH_MAX_RATIO (default 3).

    .venv/bin/python bench/page_latency.py                  # seeds a scratch fleet (~2 min)
    BENCH_SEEDED_DIR=/tmp/npc-scale-db .venv/bin/python bench/page_latency.py   # reuse one
"""

from __future__ import annotations

import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.scale_settings"

from bench import seed as seeding  # noqa: E402

# not in multiprocessing children (spawn re-imports this module as __mp_main__)
SCRATCH = seeding.setup_django() if __name__ == "__main__" else None

import httpx  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "60"))
MAX_RATIO = float(os.environ.get("BENCH_MAX_RATIO", "3"))
HX = {"HX-Request": "true"}
PAGES = [
    ("dashboard", "/", {}),
    ("dashboard (htmx poll)", "/", HX),
    ("node list", "/nodes/", {}),
    ("node list (htmx poll)", "/nodes/", HX),
    ("deployment list", "/deployments/", {}),
    ("deployment list (htmx poll)", "/deployments/", HX),
    ("incident queue", "/incidents/", {}),
]
TRIVIAL = ("trivial view", "/bench/trivial", {})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def signed_in_cookie() -> str:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    from tests.helpers import make_user

    user = get_user_model().objects.filter(username="bench-viewer").first()
    user = user or make_user("bench-viewer", "viewer")
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def start_server(port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(seeding.ROOT))
    argv = [sys.executable, "-m", "uvicorn", "console.asgi:application"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    proc = subprocess.Popen(argv, env=env, cwd=seeding.ROOT, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/login/", timeout=2)
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("uvicorn did not answer within 60 s")


def p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[18]


def main() -> int:
    if not seeding.is_seeded():
        print(f"seeding {SCRATCH.database_url} …")
        seeding.seed()
    scale = seeding.Scale()
    cookie = signed_in_cookie()
    port = free_port()
    server = start_server(port)
    sizes: dict[str, int] = {}
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", cookies={"sessionid": cookie}, timeout=30
        ) as http:

            def fetch(name: str, url: str, headers: dict) -> None:
                resp = http.get(url, headers=headers)
                if resp.status_code != 200 or "/login/" in str(resp.url):
                    raise SystemExit(f"{url}: {resp.status_code} {resp.url}")
                sizes[name] = len(resp.content)

            def refresh(rnd: int) -> None:
                if rnd % 5 == 0:  # keep every node's latest values fresh (they expire)
                    seeding._hot(scale)

            times = interleaved(fetch, before_round=refresh)
        record = in_process(cookie)
    finally:
        server.terminate()
        server.wait(10)
        SCRATCH.close()
    base = p95(times[TRIVIAL[0]])
    load = os.getloadavg()[0]
    print(
        f"{scale.nodes} nodes x {scale.npus} NPUs, {scale.deployments} deployments, "
        f"{scale.incidents} incidents; {ROUNDS} interleaved rounds, one uvicorn process, "
        f"{os.cpu_count()} CPUs, load {load:.1f}"
    )
    print(f"{'page':30s} {'p50 ms':>8s} {'p95 ms':>8s} {'KiB':>7s} {'p95/trivial':>12s}")
    worst = 0.0
    for name, _, _ in [TRIVIAL, *PAGES]:
        xs = times[name]
        ratio = p95(xs) / base
        worst = max(worst, ratio) if name != TRIVIAL[0] else worst
        print(
            f"{name:30s} {statistics.median(xs):8.1f} {p95(xs):8.1f} "
            f"{sizes[name] / 1024:7.1f} {ratio:11.2f}x"
        )
    print(f"worst page p95 / trivial p95: {worst:.2f}x (target <= {MAX_RATIO:g}x)")
    print("\n".join(record))
    return 0 if worst <= MAX_RATIO else 1


def interleaved(fetch, before_round=lambda rnd: None) -> dict[str, list[float]]:
    """ms per page: every page and the trivial view once a round, in a shuffled order, for
    ROUNDS rounds after 3 warm-up rounds. `fetch(name, url, headers)` requests and checks one."""
    times: dict[str, list[float]] = {name: [] for name, _, _ in [*PAGES, TRIVIAL]}
    for rnd in range(ROUNDS + 3):
        before_round(rnd)
        order = [*PAGES, TRIVIAL]
        random.shuffle(order)
        for name, url, headers in order:
            t0 = time.perf_counter()
            fetch(name, url, headers)
            if rnd >= 3:
                times[name].append((time.perf_counter() - t0) * 1000)
    return times


def in_process(cookie: str) -> list[str]:
    """For the record, not the target: the same pages through Django's test client in this
    process — the view's own work, without the server's fixed per-request cost (ASGI, thread
    hand-offs, sockets), which is most of the trivial view's time over HTTP on this machine
    and so flatters the ratio above."""
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    client.cookies["sessionid"] = cookie

    def fetch(name: str, url: str, headers: dict) -> None:
        resp = client.get(url, **({"HTTP_HX_REQUEST": "true"} if headers else {}))
        if resp.status_code != 200:
            raise SystemExit(f"in-process {url}: {resp.status_code}")

    times = interleaved(fetch)
    base = p95(times[TRIVIAL[0]])
    lines = ["in-process (Django test client, no server; for the record, not the target):"]
    for name, _, _ in [TRIVIAL, *PAGES]:
        xs = times[name]
        lines.append(
            f"  {name:28s} {statistics.median(xs):8.1f} {p95(xs):8.1f} "
            f"{'':7s} {p95(xs) / base:11.2f}x"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
