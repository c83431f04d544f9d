"""`python -m console.launch`: the whole console on one machine, for `make run`.

Migrates, creates the first admin when there is no user, starts the embedded Redis when
REDIS_URL is unset, then the web server, the console's Celery workers (queue `console`, and
queue `console.jobs` for benchmarks and webhooks) and beat, and a host agent for this machine —
each in its own process group. Ctrl-C (or SIGTERM) stops them all: SIGTERM, then SIGKILL after
a grace period, Redis last, so no process is left behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from console.boot import setup_django
from workers.contracts import JOBS_QUEUE

GRACE_S = 10.0
# The demo agent replays a real 8-NPU Atlas 800 (910) capture with two NPUs in Warning.
DEMO_SAMPLE = (
    Path(__file__).resolve().parent.parent
    / "workers/accelerators/samples/npu-smi-info-910-atlas800-9010-v24.1rc2-warning-procs.txt"
)


def _children(args: argparse.Namespace) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "web": [
            py,
            "-m",
            "uvicorn",
            "console.asgi:application",
            "--host",
            args.host,
            "--port",
            str(args.port),
            "--no-access-log",
        ],
        "worker": [
            py,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            "-Q",
            "console",
            "--concurrency",
            "2",
            "-n",
            "console@%h",
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
        ],
        # Benchmark runs and webhook deliveries hold a slot for long: their own worker, so they
        # never delay heartbeats and reports on queue `console`.
        "jobs-worker": [
            py,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            "-Q",
            JOBS_QUEUE,
            "--concurrency",
            "2",
            "-n",
            "console-jobs@%h",
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
        ],
        "beat": [
            py,
            "-m",
            "celery",
            "-A",
            "console",
            "beat",
            "-l",
            "info",
            "-s",
            str(args.var_dir / "celerybeat-schedule"),
        ],
        "agent": [py, "-m", "workers", "agent"],
        "demo-agent": [
            py,
            "-m",
            "workers",
            "agent",
            "--simulated",
            "--node-name",
            "demo-sim-atlas800",
        ],
    }


def _local_enroll_token(var_dir) -> str:
    """The enrollment token of this machine's own agent, created once into var/ (0600)."""
    from console.accounts.models import hash_token
    from console.accounts.services import Actor
    from console.inventory.enrollment import issue_enrollment_token
    from console.inventory.models import EnrollmentToken

    path = var_dir / "agent-enroll-token"
    if path.exists():
        raw = path.read_text().strip()
        token = EnrollmentToken.objects.filter(key_hash=hash_token(raw)).first()
        if token is not None and token.is_active():
            return raw
    _, raw = issue_enrollment_token(actor=Actor.system("make run"), name="local agent (make run)")
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(raw)
    return raw


def _forget_stale_identity(state_dir: Path) -> None:
    """A local agent's saved identity that this database does not know (var/ reset, another
    checkout) would be refused forever: drop it, so the agent enrolls again with the token."""
    from console.inventory.models import NodeCredential
    from workers.agent import IDENTITY_FILE
    from workers.channel import Identity

    path = state_dir / IDENTITY_FILE
    try:
        identity = Identity.load(path)
    except ValueError:
        identity = None
        path.unlink(missing_ok=True)
    if identity is None:
        return
    known = NodeCredential.objects.filter(
        pk=identity.kid, node__name=identity.node, revoked_at=None
    ).exists()
    if not known:
        print(f"[launch] {path}: a credential this console does not know; enrolling again")
        path.unlink(missing_ok=True)


def _stop_all(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + GRACE_S
    for name, proc in procs.items():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"[launch] {name} ignored SIGTERM; killing", flush=True)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> int:
    setup_django()
    from django.conf import settings
    from django.core.management import call_command

    from console import embedded_redis

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("NPU_CONSOLE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("NPU_CONSOLE_PORT", "8000")))
    parser.add_argument("--no-agent", action="store_true", help="do not start a local host agent")
    parser.add_argument(
        "--demo",
        action="store_true",
        default=os.environ.get("NPU_CONSOLE_DEMO") == "1",
        help="also start an agent with SIMULATED NPUs (replayed npu-smi captures)",
    )
    args = parser.parse_args()
    args.var_dir = settings.VAR_DIR

    call_command("migrate", interactive=False, verbosity=0)
    call_command("ensure_admin")

    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    redis_proc = None
    env = dict(os.environ)
    if settings.EMBEDDED_REDIS:
        redis_proc = embedded_redis.start(
            settings.EMBEDDED_REDIS_SOCKET, settings.VAR_DIR / "redis"
        )
        print(f"[launch] embedded Redis on {settings.EMBEDDED_REDIS_SOCKET}", flush=True)
    env.setdefault("NPU_AGENT_BROKER_URL", settings.CELERY_BROKER_URL)
    env.setdefault("NPU_AGENT_STATE_DIR", str(settings.VAR_DIR / "agent"))
    env.setdefault("NPU_AGENT_ENROLL_TOKEN", _local_enroll_token(settings.VAR_DIR))
    for state_dir in (Path(env["NPU_AGENT_STATE_DIR"]), settings.VAR_DIR / "agent-demo"):
        _forget_stale_identity(state_dir)

    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, argv in _children(args).items():
            if (name == "agent" and args.no_agent) or (name == "demo-agent" and not args.demo):
                continue
            child_env = env
            if name == "demo-agent":  # a node of its own: its own identity and engines
                child_env = dict(
                    env,
                    NPU_AGENT_SIM_SAMPLE=str(DEMO_SAMPLE),
                    NPU_AGENT_STATE_DIR=str(settings.VAR_DIR / "agent-demo"),
                )
            procs[name] = subprocess.Popen(argv, env=child_env, start_new_session=True)
        print(
            f"[launch] console on http://{args.host}:{args.port}/  (Ctrl-C stops everything)",
            flush=True,
        )
        while not stopping:
            dead = [n for n, p in procs.items() if p.poll() is not None]
            if dead:
                print(f"[launch] {', '.join(dead)} exited; stopping the rest", flush=True)
                return_code = 1
                break
            time.sleep(0.2)
        else:
            return_code = 0
    finally:
        print("[launch] stopping…", flush=True)
        _stop_all(procs)
        from workers.engine.supervisor import stop_all_recorded

        engines = stop_all_recorded(Path(env["NPU_AGENT_STATE_DIR"]))
        engines += stop_all_recorded(settings.VAR_DIR / "agent-demo")
        if engines:
            print(f"[launch] stopped {engines} engine(s) the local agent was running", flush=True)
        if redis_proc is not None:
            embedded_redis.stop(redis_proc)
        print("[launch] stopped", flush=True)
    return return_code


if __name__ == "__main__":
    sys.exit(main())
