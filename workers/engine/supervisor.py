"""The engine supervisor: one per agent, it runs, watches and stops this host's vLLM engines.

Like supervisor/circus: each engine leads its own process group; it is "ready" only after a
passing health probe; a stop is SIGTERM to the group, then SIGKILL after a grace period; logs
go to size-bounded files; after `restart_max` quick crashes it gives up (crash-loop).
Engines outlive the agent by design: `shutdown()` stops watching, not the engines, and the
next agent's `adopt()` takes them over from their state files. An agent whose NPUs are
simulated gets a `SimulatedRunner` in the real runner's place (simulated.py): the same phases,
reports, state file and log, and no process.

Thread safety: every public method may be called from any thread (Celery runs tasks in a
thread pool). Operations on one replica are serialised by that replica's lock; the monitor
thread skips a replica whose lock is held (a stop in progress) and comes back next interval.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workers.config import engine_host_from_env
from workers.contracts import STATUS_TEXT_MAX_CHARS, EnginePhase, EngineReport, EngineSpec, clip
from workers.engine.argv import DEFAULT_SET_ENV
from workers.engine.logs import LOG_KEEP, LOG_MAX_BYTES, latest_log, read_log, replica_dir
from workers.engine.logs import space_problem as logs_space_problem
from workers.engine.policy import HANG_AFTER_S, HEALTH_FAILURES
from workers.engine.runner import Runner, Settings
from workers.engine.simulated import SimulatedRunner
from workers.engine.state import Engine, all_state_dirs, load_state, remove_state

log = logging.getLogger("workers.engine")
DEFAULT_PHASE_TIMEOUTS = {EnginePhase.STARTING: 120.0, EnginePhase.LOADING: 900.0}


class Supervisor:
    """Runs engines from `EngineSpec`s and reports every phase change through `report`.

    python: the interpreter that runs `-m vllm.entrypoints.openai.api_server` (a group
    member: `-m vllm.entrypoints.cli.main serve`; tests pass one whose PYTHONPATH holds a
    fake vLLM). cann_env: the CANN variables for NPU engines;
    None = source `set_env_path` once (absent file: none), {} = none. base_env: the agent
    environment the engine's allow-list reads (default os.environ). engine_host: the address
    NPU engines bind to instead of their spec's host (AgentConfig.engine_host); None = read
    NPU_AGENT_ENGINE_HOST from base_env, unset there = the spec's host. CPU engines (tests,
    demos) keep their spec's host: the console reaches them on loopback.
    simulated: simulate the engines instead of running them (workers/engine/simulated.py: no
    process, every report labelled SIMULATED), for agents whose NPUs are simulated only;
    simulated_phase_s: seconds in starting and loading there (its PHASE_S by default).
    """

    def __init__(
        self,
        state_dir: Path,
        node: str,
        report: Callable[[EngineReport], None],
        python: str = sys.executable,
        probe_interval_s: float = 2.0,
        phase_timeouts: Mapping[str, float] | None = None,
        stop_grace_s: float = 20.0,
        backoff_base_s: float = 2.0,
        backoff_max_s: float = 300.0,
        cann_env: Mapping[str, str] | None = None,
        *,
        base_env: Mapping[str, str] | None = None,
        set_env_path: str = DEFAULT_SET_ENV,
        hang_after_s: float = HANG_AFTER_S,
        health_failures: int = HEALTH_FAILURES,
        probe_timeout_s: float | None = None,
        log_max_bytes: int = LOG_MAX_BYTES,
        log_keep: int = LOG_KEEP,
        port_free_timeout_s: float = 10.0,
        engine_host: str | None = None,
        simulated: bool = False,
        simulated_phase_s: Mapping[str, float] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        base_env = dict(os.environ if base_env is None else base_env)
        self.engine_host = engine_host or engine_host_from_env(base_env)
        self.node = node
        self.probe_interval_s = probe_interval_s
        settings = Settings(
            node=node,
            report=report,
            python=python,
            base_env=base_env,
            cann_env=cann_env,
            set_env_path=set_env_path,
            phase_timeouts={**DEFAULT_PHASE_TIMEOUTS, **(phase_timeouts or {})},
            stop_grace_s=stop_grace_s,
            backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s,
            probe_timeout_s=probe_timeout_s or min(2.0, max(0.5, probe_interval_s)),
            hang_after_s=hang_after_s,
            health_failures=health_failures,
            log_max_bytes=log_max_bytes,
            log_keep=log_keep,
            port_free_timeout_s=port_free_timeout_s,
        )
        self.simulated = simulated
        self._runner = (
            SimulatedRunner(settings, simulated_phase_s) if simulated else Runner(settings)
        )
        self._engines: dict[int, Engine] = {}
        self._locks: dict[int, threading.RLock] = {}
        self._guard = threading.Lock()
        self._halt = threading.Event()  # the current monitor thread's stop signal
        self._thread: threading.Thread | None = None

    # --- public API ----------------------------------------------------------------------
    def start(self, spec: EngineSpec) -> EngineReport:
        """Run `spec`. Idempotent per (replica_id, generation): the same generation again
        returns the current report and changes nothing (whatever its phase, crash-loop
        included: retrying needs a new generation); an older generation is ignored; a newer
        one stops the old engine first (blocking). Refused — phase failed, no process, not
        kept — when the model path has no config.json or the port is taken (never checked for
        a group's follower, which binds no port). A group member is started the same way: the
        console restarts a group by sending every member a new generation."""
        spec = self._bind(spec)
        with self._lock_for(spec.replica_id):
            current = self._engines.get(spec.replica_id)
            if current is not None:
                if current.generation >= spec.generation:
                    if current.generation > spec.generation:
                        log.warning("replica %s: older generation ignored", spec.replica_id)
                    return current.report(self.node)
                self._stop_locked(current, f"replaced by generation {spec.generation}")
            engine = Engine(spec=spec, directory=replica_dir(self.state_dir, spec.replica_id))
            refusal = self._runner.refusal(spec, self._ports_in_use(spec.replica_id))
            if refusal is not None:
                engine.set_phase(EnginePhase.FAILED, refusal)
                return self._runner.emit(engine)
            if self._runner.spawn(engine):
                with self._guard:
                    self._engines[spec.replica_id] = engine
                self._ensure_monitor()
            return engine.report(self.node)

    def stop(self, replica_id: int, generation: int | None = None) -> EngineReport:
        """Stop the replica's engine and report `stopped`. Idempotent: stopping an unknown or
        already stopped replica reports `stopped` again; a stop for an older generation than
        the one running changes nothing. Blocks until no process of the engine's group is
        left (SIGTERM, stop_grace_s, SIGKILL) and its port is free."""
        with self._lock_for(replica_id):
            engine = self._engines.get(replica_id)
            if engine is None:
                return self._stop_unknown(replica_id, generation)
            if generation is not None and generation < engine.generation:
                return engine.report(self.node)
            self._stop_locked(engine, "stopped on request")
            return engine.report(self.node)

    def adopt(self) -> list[EngineReport]:
        """Take over the engines recorded under state_dir (call once, when the agent starts,
        before any start()); starts the monitor. Never starts a second engine for a replica
        already supervised. Returns the reports it sent."""
        reports = []
        for directory in all_state_dirs(self.state_dir):
            engine = load_state(directory)
            if engine is None:
                continue
            with self._lock_for(engine.replica_id):
                if engine.replica_id in self._engines:
                    continue
                self._runner.adopt(engine)
                with self._guard:
                    self._engines[engine.replica_id] = engine
                reports.append(engine.report(self.node))
        self._ensure_monitor()
        return reports

    def reports(self) -> list[EngineReport]:
        """The current report of every supervised engine (for heartbeats). Never blocks on a
        stop in progress."""
        with self._guard:
            engines = list(self._engines.values())
        return [engine.report(self.node) for engine in engines]

    def log_error(self) -> str | None:
        """Why engine logs cannot be written now (the state dir's disk full, or the last write
        that failed), or None. Engines keep running either way."""
        problem = logs_space_problem(self.state_dir) or self._runner.write_error
        return clip(problem, STATUS_TEXT_MAX_CHARS) if problem else None  # the contract's cap

    def log_tail(self, replica_id: int, offset: int = 0, max_bytes: int = 65536) -> dict[str, Any]:
        """read_log() of the replica's current log (or of its newest log once stopped), plus
        `path` (a new path means a new run: restart from offset 0)."""
        engine = self._engines.get(replica_id)
        path = engine.log_path if engine is not None else None
        path = path or latest_log(replica_dir(self.state_dir, replica_id))
        if path is None:
            return {"text": "", "next_offset": 0, "overflow": False, "path": None}
        return {**read_log(path, offset, max_bytes), "path": str(path)}

    def check_all(self) -> None:
        """One monitor pass over every engine (the monitor thread calls it each interval)."""
        with self._guard:
            engines = list(self._engines.values())
        for engine in engines:
            lock = self._lock_for(engine.replica_id)
            if not lock.acquire(blocking=False):
                continue  # a start/stop holds it; next interval
            try:
                if self._engines.get(engine.replica_id) is engine:
                    self._runner.tick(engine)
            except Exception:  # noqa: BLE001 - one engine's trouble must not stop the others
                log.exception("monitoring replica %s failed", engine.replica_id)
            finally:
                lock.release()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the monitor thread. The engines keep running (adopt() takes them back)."""
        self._halt.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # --- internals -----------------------------------------------------------------------
    def _bind(self, spec: EngineSpec) -> EngineSpec:
        """The spec with the host this agent binds NPU engines to (see engine_host)."""
        if self.engine_host is None or spec.device != "npu" or spec.host == self.engine_host:
            return spec
        return EngineSpec.model_validate({**spec.model_dump(), "host": self.engine_host})

    def _lock_for(self, replica_id: int) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(replica_id, threading.RLock())

    def _ports_in_use(self, replica_id: int) -> dict[int, int]:
        """API port -> replica of the other engines (a group's follower binds none)."""
        with self._guard:
            return {
                e.spec.port: e.replica_id
                for e in self._engines.values()
                if e.replica_id != replica_id and not e.spec.follower
            }

    def _stop_locked(self, engine: Engine, reason: str) -> None:
        self._runner.stop(engine, reason)
        with self._guard:
            if self._engines.get(engine.replica_id) is engine:
                del self._engines[engine.replica_id]

    def _stop_unknown(self, replica_id: int, generation: int | None) -> EngineReport:
        """A stop for a replica not supervised: end a recorded process if one is still alive
        (a state file not adopted), then report stopped."""
        directory = replica_dir(self.state_dir, replica_id)
        recorded = load_state(directory)
        if recorded is not None:
            self._runner.end_processes(recorded)
            remove_state(directory)
        return self._runner.send(
            EngineReport(
                node=self.node,
                replica_id=replica_id,
                generation=generation or (recorded.generation if recorded else 0),
                phase=EnginePhase.STOPPED,
                reason="not running",
                at=datetime.now(UTC),
            )
        )

    def _ensure_monitor(self) -> None:
        """Start the monitor thread unless one is running (each thread has its own stop
        event, so a thread still finishing after shutdown() never blocks a new one)."""
        with self._guard:
            if self._thread is not None and self._thread.is_alive() and not self._halt.is_set():
                return
            self._halt = threading.Event()
            self._thread = threading.Thread(
                target=self._monitor, args=(self._halt,), name="engine-monitor", daemon=True
            )
            self._thread.start()

    def _monitor(self, halt: threading.Event) -> None:
        while not halt.wait(self.probe_interval_s):
            self.check_all()


def stop_all_recorded(state_dir: Path, grace_s: float = 20.0) -> int:
    """Stop every engine recorded under `state_dir` (for `make run`'s Ctrl-C, where nothing
    may outlive the console; a production agent leaves engines running). Returns how many."""
    from workers.engine.process import matching_process, terminate_group
    from workers.engine.state import all_state_dirs, load_state, remove_state

    stopped = 0
    for directory in all_state_dirs(Path(state_dir)):
        engine = load_state(directory)
        if engine is None:
            continue
        proc = matching_process(engine.pid, engine.create_time)
        if proc is not None:
            terminate_group(proc.pid, engine.create_time, grace_s)
            stopped += 1
        remove_state(directory)
    return stopped
