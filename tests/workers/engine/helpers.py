"""Plain helpers for the engine tests (fixtures are in conftest.py)."""

from __future__ import annotations

import threading

import psutil

from tests.kit import free_port, wait_for
from workers.contracts import EngineReport

__all__ = ["Reports", "alive", "free_port", "wait_for"]  # free_port, wait_for: the kit's


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
