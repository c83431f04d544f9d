"""Command dispatch latency: from the API call to the host agent starting the command.

A real uvicorn serves the console; a real host agent (simulated NPUs, `python -m workers
agent` via bench/agent_probe.py, which only timestamps each command as the command loop is
about to run it) enrolls the real way — an enrollment token in NPU_AGENT_ENROLL_TOKEN, a state
dir, the key exchange answered by the inbox consumer of a real console worker — and then
reads its signed command list `npc:cmd:<node>` (workers/channel.py). Each round POSTs
`/api/v1/nodes/<node>/checks` with an operator's write token (the API records the run and,
after commit, signs and encrypts `host.run_checks` for the node: console/inventory/commands.py)
and waits for the agent's start time of that run. Interleaved with each round: the same
command signed and pushed straight from this process (`send_command`, no HTTP, no database
write — the transport alone) and a bare Redis LPUSH -> BRPOP (another thread blocked on the
list) — the floor of any Redis-carried command.
Prints p50/p95 of the three and the ratios; target p95 < 50 ms on loopback (exit 1 if not).

    .venv/bin/python bench/dispatch_latency.py          # BENCH_ROUNDS=200
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import seed as seeding  # noqa: E402

# not in multiprocessing children (spawn re-imports this module as __mp_main__)
SCRATCH = seeding.setup_django() if __name__ == "__main__" else None

import httpx  # noqa: E402

from bench import fleet  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "200"))
TARGET_MS = 50.0
NODE = "bench-dispatch"
PRERUN_KEY = "npc:bench:prerun"


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1]


def start_agent(token: str) -> subprocess.Popen:
    env = dict(
        os.environ,
        PYTHONPATH=str(seeding.ROOT),
        NPU_AGENT_ENROLL_TOKEN=token,
        NPU_AGENT_BROKER_URL=os.environ["REDIS_URL"],
        NPU_AGENT_STATE_DIR=str(SCRATCH.dir / "agent"),
        NPU_AGENT_HEARTBEAT_S="5",
        BENCH_PRERUN_KEY=PRERUN_KEY,
    )
    argv = [sys.executable, str(seeding.ROOT / "bench/agent_probe.py")]
    argv += ["--simulated", "--node-name", NODE]
    with (SCRATCH.dir / "agent.log").open("ab") as out:
        return subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def start_web(port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(seeding.ROOT))
    argv = [sys.executable, "-m", "uvicorn", "console.asgi:application"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    return subprocess.Popen(argv, env=env, cwd=seeding.ROOT, stdout=subprocess.DEVNULL)


def bare_round_trip(r, rounds: int) -> list[float]:
    """LPUSH a timestamp; a thread blocked in BRPOP notes when it arrives (ms)."""
    out: list[float] = []
    key = "npc:bench:bare"

    def consumer() -> None:
        c = r.connection_pool  # same server, its own connection
        import redis

        rc = redis.Redis(connection_pool=c)
        for _ in range(rounds):
            _, raw = rc.brpop(key, timeout=10)
            out.append((time.time() - float(raw)) * 1000)

    th = threading.Thread(target=consumer)
    th.start()
    time.sleep(0.05)
    for _ in range(rounds):
        r.lpush(key, repr(time.time()))
        time.sleep(0.02)
    th.join(30)
    return out


def main() -> int:
    from django.core.management import call_command

    from console.accounts.services import Actor, create_token
    from console.hot import get_redis
    from console.inventory.enrollment import issue_enrollment_token
    from tests.helpers import make_user

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    call_command("migrate", verbosity=0)
    _, enroll = issue_enrollment_token(actor=Actor.system("bench"), name="bench")
    op = make_user("bench-operator", "operator")
    _, api_token = create_token(actor=Actor(user=op, name=op.username), name="b", scope="write")
    r = get_redis()
    r.delete(PRERUN_KEY)
    port = fleet_port()
    worker = fleet.start_worker(SCRATCH.dir / "worker.log", concurrency=1)
    web = start_web(port)
    agent = None
    api, http_ms, direct, bare = [], [], [], []
    try:
        fleet.wait_worker_ready()
        _wait_lease(r)
        # The agent starts once the inbox consumer answers enrollments: enrolling is not what
        # this bench measures (and agents before the Enrollment class could lock themselves
        # out when the answer came after their 5-s socket timeout).
        agent = start_agent(enroll)
        _wait_enrolled(agent)
        time.sleep(3)  # let the first beat and the agent-start checks go through
        r.delete(PRERUN_KEY)
        headers = {"Authorization": f"Bearer {api_token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as http:
            _wait_web(http)
            for i in range(ROUNDS + 5):  # 5 warm-up rounds
                t0 = time.time()
                resp = http.post(f"/api/v1/nodes/{NODE}/checks")
                answered = time.time()
                if resp.status_code != 202:
                    raise SystemExit(f"POST checks: {resp.status_code} {resp.text}")
                run_id = resp.json()["id"]
                started = _wait_started(r, "host.run_checks", [run_id])
                time.sleep(0.05)
                t1 = time.time()
                _send_ping(i)
                pinged = _wait_started(r, "host.ping", [f"bench-{i}"])
                if i >= 5:
                    api.append((started - t0) * 1000)
                    http_ms.append((answered - t0) * 1000)
                    direct.append((pinged - t1) * 1000)
                    bare.extend(bare_round_trip(r, 1))
                time.sleep(0.1)
    finally:
        for p in (agent, web, worker):
            if p is not None:
                fleet.stop(p)
        SCRATCH.close()
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{ROUNDS} rounds, {os.cpu_count()} CPUs, load {load}")
    print(f"{'':42s} {'p50 ms':>8s} {'p95 ms':>8s} {'max ms':>8s}")
    for name, xs in (
        ("API call -> agent starts the command", api),
        ("  (API call -> its 202 answer)", http_ms),
        ("send_command (signed) -> agent starts it", direct),
        ("bare Redis LPUSH -> BRPOP", bare),
    ):
        print(f"{name:42s} {pct(xs, 50):8.2f} {pct(xs, 95):8.2f} {max(xs):8.2f}")
    print(
        f"ratio p95 API/bare: {pct(api, 95) / pct(bare, 95):.1f}x, "
        f"signed command/bare: {pct(direct, 95) / pct(bare, 95):.1f}x; "
        f"target p95 < {TARGET_MS:g} ms: {'met' if pct(api, 95) < TARGET_MS else 'NOT met'}"
    )
    return 0 if pct(api, 95) < TARGET_MS else 1


def _wait_lease(r) -> None:
    """Until the console worker's inbox consumer holds its lease (it answers enrollments)."""
    from console.inventory.inbox import LEADER_KEY

    deadline = time.monotonic() + 30
    while not r.exists(LEADER_KEY):
        if time.monotonic() > deadline:
            raise SystemExit(f"the inbox consumer never started:\n{_tail('worker.log')}")
        time.sleep(0.2)


def _wait_enrolled(agent: subprocess.Popen) -> None:
    """Until the agent holds its identity and the console has registered its first beat."""
    from console.inventory.models import Node

    identity = SCRATCH.dir / "agent" / "identity.json"
    deadline = time.monotonic() + 90
    while not (identity.exists() and Node.objects.filter(name=NODE, status="online").exists()):
        if time.monotonic() > deadline or agent.poll() is not None:
            raise SystemExit(
                f"the agent did not enroll:\n{_tail('agent.log')}\n{_tail('worker.log')}"
            )
        time.sleep(0.5)


def _tail(name: str, lines: int = 15) -> str:
    """The end of a log in the scratch dir (it is deleted when the bench stops)."""
    text = (SCRATCH.dir / name).read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(f"  {name}: {line}" for line in text)


def _send_ping(i: int) -> None:
    from console.inventory.commands import send_command

    if send_command(NODE, "host.ping", [f"bench-{i}"]) is None:
        raise SystemExit(f"{NODE} has no active credential")


def fleet_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_web(http: httpx.Client) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            http.get(f"/api/v1/nodes/{NODE}")
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("uvicorn did not answer")


def _wait_started(r, task: str, args: list) -> float:
    """The agent's start time of command `task` with `args` (other commands are skipped)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        item = r.blpop(PRERUN_KEY, timeout=5)
        if item is None:
            continue
        doc = json.loads(item[1])
        if doc["task"] == task and doc["args"] == args:
            return doc["t"]
    raise SystemExit(f"the agent never started {task} {args}")


if __name__ == "__main__":
    sys.exit(main())
