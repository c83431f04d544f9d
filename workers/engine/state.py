"""One supervised engine in memory (`Engine`) and on disk (`state.json`).

`<state_dir>/engines/<replica_id>/state.json` is written atomically (temp file + rename) on
every spawn and every backoff / crash-loop, and removed on a requested stop, so that an
agent that restarts can find its engines again (`Supervisor.adopt`). The file holds the
spec, and with it the replica's engine key: it is written mode 0600 (the agent's user only).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from pydantic import ValidationError

from workers.contracts import (
    LOG_TAIL_LINE_MAX_CHARS,
    LOG_TAIL_MAX_LINES,
    REASON_MAX_CHARS,
    EnginePhase,
    EngineReport,
    EngineSpec,
    clip,
    fit_metrics,
)
from workers.engine.policy import HealthTracker

log = logging.getLogger("workers.engine")
STATE_FILE = "state.json"


@dataclass
class Termination:
    """The monitor is ending a process it gave up on (phase timeout), without blocking."""

    reason: str
    kill_at: float  # monotonic: SIGKILL the group if it is still there then
    extra: list[psutil.Process] = field(default_factory=list)  # descendants outside the group
    killed: bool = False


@dataclass
class Engine:
    """Everything the supervisor knows about one replica (one generation)."""

    spec: EngineSpec
    directory: Path
    phase: str = EnginePhase.STARTING
    reason: str = ""
    proc: subprocess.Popen | None = None
    pid: int | None = None
    create_time: float | None = None
    adopted: bool = False  # found alive after an agent restart: not our child
    run: int = 0
    log_path: Path | None = None
    phase_since: float = field(default_factory=time.monotonic)
    restarts: int = 0
    crashes: list[float] = field(default_factory=list)  # wall-clock times, for the window
    backoff_until: float = 0.0  # monotonic
    exit_code: int | None = None
    signal: int | None = None
    stop_requested: bool = False
    terminating: Termination | None = None
    health: HealthTracker = field(default_factory=HealthTracker)
    metrics: dict[str, float] = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)

    @property
    def replica_id(self) -> int:
        return self.spec.replica_id

    @property
    def generation(self) -> int:
        return self.spec.generation

    def set_phase(self, phase: str, reason: str = "") -> bool:
        """Change phase (restarting the phase clock); False when nothing changed."""
        changed = phase != self.phase or reason != self.reason
        if phase != self.phase:
            self.phase_since = time.monotonic()
        self.phase, self.reason = phase, reason
        return changed

    def report(self, node: str) -> EngineReport:
        """The engine's report, within the contract's caps (a reason or log line too long is
        cut with a visible marker; metrics the console would refuse — NaN, negative — left
        out), so the console never refuses it."""
        return EngineReport(
            node=node,
            replica_id=self.replica_id,
            generation=self.generation,
            phase=self.phase,
            reason=clip(self.reason, REASON_MAX_CHARS),
            pid=self.pid,
            port=None if self.spec.follower else self.spec.port,  # a follower serves none
            exit_code=self.exit_code,
            signal=self.signal,
            restarts=self.restarts,
            log_path=str(self.log_path) if self.log_path else None,
            at=datetime.now(UTC),
            metrics=fit_metrics(self.metrics),
            log_tail=[clip(line, LOG_TAIL_LINE_MAX_CHARS) for line in self.log_tail][
                -LOG_TAIL_MAX_LINES:
            ],
        )

    def to_state(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "generation": self.generation,
            "phase": self.phase,
            "pid": self.pid,
            "create_time": self.create_time,
            "port": self.spec.port,
            "run": self.run,
            "restarts": self.restarts,
            "crashes": self.crashes,
            "log_path": str(self.log_path) if self.log_path else None,
            "spec": self.spec.model_dump(mode="json"),
        }


def write_state(engine: Engine) -> None:
    """Atomically (re)write the engine's state file, mode 0600 (it holds the engine key)."""
    engine.directory.mkdir(parents=True, exist_ok=True)
    path = engine.directory / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover temp file keeps its old mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(engine.to_state(), fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def remove_state(directory: Path) -> None:
    try:
        (directory / STATE_FILE).unlink()
    except FileNotFoundError:
        pass


def load_state(directory: Path) -> Engine | None:
    """The engine recorded in directory/state.json, or None (missing or unreadable: logged)."""
    path = directory / STATE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        spec = EngineSpec.model_validate(data["spec"])
    except FileNotFoundError:
        return None
    except ValidationError as exc:  # without the input values: the spec holds the engine key
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_input=False)
        )
        log.error("ignoring unreadable engine state %s: %s", path, problems)
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.error("ignoring unreadable engine state %s: %s", path, exc)
        return None
    log_path = data.get("log_path")
    return Engine(
        spec=spec,
        directory=directory,
        phase=str(data.get("phase") or EnginePhase.STARTING),
        pid=data.get("pid"),
        create_time=data.get("create_time"),
        run=int(data.get("run") or 0),
        restarts=int(data.get("restarts") or 0),
        crashes=[float(t) for t in data.get("crashes") or []],
        log_path=Path(log_path) if log_path else None,
    )


def all_state_dirs(state_dir: Path) -> list[Path]:
    """Replica directories that hold a state file, in replica order."""
    root = Path(state_dir) / "engines"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.isdigit() and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name))
