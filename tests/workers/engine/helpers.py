"""Plain helpers for the engine tests (fixtures are in conftest.py)."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from workers.contracts import EngineReport


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition"):
    """Poll predicate until truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def install_fake_vllm(root: Path) -> Path:
    """Make `python -m vllm.entrypoints.openai.api_server` run fake_vllm_server.py for a
    python whose PYTHONPATH holds `root`. Returns root."""
    package = root / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for directory in (root / "vllm", root / "vllm" / "entrypoints", package):
        (directory / "__init__.py").write_text("")
    shutil.copy(Path(__file__).with_name("fake_vllm_server.py"), package / "api_server.py")
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Reports:
    """A report callback that keeps what it was given (thread-safe)."""

    def __init__(self) -> None:
        self.items: list[EngineReport] = []
        self._lock = threading.Lock()

    def __call__(self, report: EngineReport) -> None:
        with self._lock:
            self.items.append(report)

    def phases(self, replica_id: int = 1, generation: int | None = None) -> list[str]:
        with self._lock:
            return [
                r.phase
                for r in self.items
                if r.replica_id == replica_id and generation in (None, r.generation)
            ]

    def last(self, phase: str, replica_id: int = 1) -> EngineReport | None:
        with self._lock:
            found = [r for r in self.items if r.phase == phase and r.replica_id == replica_id]
        return found[-1] if found else None

    def wait(self, phase: str, timeout: float = 10.0, replica_id: int = 1) -> EngineReport:
        return wait_for(lambda: self.last(phase, replica_id), timeout, f"phase {phase}")
