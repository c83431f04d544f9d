"""`make run`'s launcher: everything starts, answers, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.kit import REPO, free_port, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.backend]  # it launches on DATABASE_URL


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_launch_starts_everything_and_ctrl_c_leaves_nothing_behind():
    var = Path(tempfile.mkdtemp(prefix="npc-launch-"))
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        NPU_CONSOLE_VAR_DIR=str(var),
        NPU_CONSOLE_ADMIN_PASSWORD="launch-pass-1",
        PYTHONUNBUFFERED="1",
    )
    log = open(var / "launch.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "console.launch", "--port", str(port), "--demo"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: answers(f"http://127.0.0.1:{port}/login/") or proc.poll() is not None,
            120,
            interval=0.5,
            message="the web server",
        )
        assert proc.poll() is None, (var / "launch.log").read_text()
        children = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        for part in ("uvicorn", "-Q console ", "-Q console.jobs", "beat", "workers agent"):
            assert part in names, f"{part} not running: {names}"
        assert "redis-server" in names, f"redis-server not running: {names}"
        assert (var / "redis.sock").exists()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, (var / "launch.log").read_text()
        wait_for(
            lambda: (
                not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
            ),
            15,
            message="every child to exit",
        )
        assert "created admin user 'admin'" in (var / "launch.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        shutil.rmtree(var, ignore_errors=True)
