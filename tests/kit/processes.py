"""Child processes of tests (agents, console workers, web servers): own process group,
output kept in a file for failures, the test database and Redis in their environment."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


def database_url() -> str:
    """A URL for the test database, for processes started by tests."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    host = s.get("HOST") or "127.0.0.1"
    auth = s.get("USER") or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{host}:{s.get('PORT') or 5432}/{s['NAME']}"


def child_env(redis_url: str, **extra: str) -> dict[str, str]:
    """This process's environment for a child: the test Redis and database, unbuffered output,
    `extra` on top."""
    env = dict(os.environ)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # set for Playwright's loop here; not for children
    env.update(REDIS_URL=redis_url, DATABASE_URL=database_url(), PYTHONUNBUFFERED="1", **extra)
    return env


class Proc:
    """A child process in its own process group, its output kept in a file for failures."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._fh = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM to the group, SIGKILL after `timeout` s; idempotent."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, 15)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, 9)
                self.popen.wait()
        self._fh.close()


def kill_engines_of(marker: str) -> None:
    """SIGKILL the process group of every process whose command line mentions `marker` (a
    tmp path of the test): an engine's EngineCore and workers rename themselves
    (VLLM::EngineCore) and would outlive a kill of the API server alone."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.kill()  # not a group leader: the group kill missed it
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
