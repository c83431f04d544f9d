"""Redis dies (SIGKILL) after a start command was queued and before an agent consumed it:
the command survives, the engine is started once, and a second start command for the same
replica and generation (what a repeated dispatch looks like) after another Redis restart
starts nothing more — a start is idempotent per (replica id, generation).

Real processes: a private redis-server (append-only file, fsync on every write; never the
shared one), a host agent, the stand-in engine. Promise: docs/faults.md "Redis restarted".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.kit import free_port, install_as_vllm, start_agent, wait_for
from workers import channel
from workers.contracts import EngineSpec, Tasks

pytestmark = [pytest.mark.faults, pytest.mark.worker]
NODE = "fault-redis"


class PrivateRedis:
    """A redis-server of this test only, persisting every write before answering."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.port = directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--dir", str(self.dir), "--save", "", "--appendonly", "yes"]
        argv += ["--appendfsync", "always", "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(argv, start_new_session=True)
        try:
            wait_for(self.ping, 20, message="redis-server to answer")
        except BaseException:  # never leave a redis-server behind the test
            self.stop()
            raise

    def ping(self) -> bool:
        import redis

        try:
            return redis.Redis.from_url(self.url, socket_timeout=1).ping()
        except redis.RedisError:
            return False

    def crash_and_restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # no shutdown save: only the AOF remains
        self.proc.wait()
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _send_when_up(send) -> str | None:
    import redis as redis_py

    try:
        return send()
    except redis_py.RedisError:
        return None


def engines_of(model_dir: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if str(model_dir) in " ".join(p.info["cmdline"] or []) and p.info["status"] != "zombie":
            found.append(p)
    return found


def test_a_start_queued_across_redis_restarts_runs_exactly_once(tmp_path, model_dir):
    if not Path("/usr/bin/redis-server").exists() and not _which("redis-server"):
        pytest.skip("redis-server is not installed")
    redis = PrivateRedis(tmp_path)
    # the node's identity, as enrollment leaves it in the state dir; commands signed with it
    # exactly as console/inventory/commands.py signs them
    identity = channel.Identity(node=NODE, kid=1, key_hex=os.urandom(32).hex())
    identity.save(tmp_path / "agent-state" / "identity.json")

    def send_start() -> str:
        import redis as redis_py

        cmd_id, raw = channel.command(
            identity.key,
            node=NODE,
            kid=1,
            task=Tasks.HOST_START_REPLICA,
            args=[spec.model_dump(mode="json")],
        )
        redis_py.Redis.from_url(redis.url).rpush(channel.cmd_key(NODE), raw)
        return cmd_id

    spec = EngineSpec(
        replica_id=77,
        generation=1,
        node=NODE,
        deployment="durable",
        model_path=str(model_dir),
        served_model_name="tiny",
        port=free_port(),
        device="cpu",
    )
    agent = None
    try:
        first = send_start()
        redis.crash_and_restart()  # queued, not consumed: no agent runs yet
        agent = start_agent(
            redis.url,
            "not-enrolled",
            tmp_path,
            name=NODE,
            engine_python=sys.executable,
            state_dir=tmp_path / "agent-state",  # where the identity was saved above
            PYTHONPATH=str(install_as_vllm(tmp_path / "fake-vllm")),
            NPU_AGENT_ENGINE_PROBE_S="1",
        )
        wait_for(lambda: f"[{first}] done" in agent.output(), 60, message="the start")
        wait_for(lambda: _answers(spec.port), 30, message="the engine to answer")
        (engine,) = engines_of(model_dir)

        redis.crash_and_restart()  # while the agent runs: it reconnects
        again = wait_for(lambda: _send_when_up(send_start), 30, message="redis back")
        wait_for(lambda: f"[{again}] done" in agent.output(), 60, message="the 2nd delivery")
        assert [p.pid for p in engines_of(model_dir)] == [engine.pid]  # no second engine
        assert _answers(spec.port)
        logs = sorted(p.name for p in (tmp_path / "agent-state/engines/77").glob("*.log"))
        assert logs == ["gen1-run1.log"]  # one run: the start happened once
        phases = re.findall(r"replica 77 gen 1: (\S+)", agent.output())
        assert phases == ["loading", "ready"]  # no refusal, no failure, no second run
    except AssertionError:
        print("--- agent ---\n", agent.output()[-6000:] if agent else "")
        raise
    finally:
        if agent is not None:
            agent.stop()
        for p in engines_of(model_dir):
            os.killpg(p.pid, signal.SIGKILL)
        redis.stop()


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _which(name: str) -> str | None:
    import shutil

    return shutil.which(name)
