"""Adoption: a restarted agent takes over the engines its predecessor left running."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from workers.contracts import EnginePhase as P
from workers.engine import probes, process
from workers.engine.group import member_words
from workers.engine.state import Engine

if TYPE_CHECKING:  # runner.py imports this module (Runner.adopt)
    from workers.engine.runner import Runner


def adopt(runner: Runner, engine: Engine) -> None:
    """Take over an engine read from its state file, and report what it is now:
    its process alive (same pid AND create time) -> supervised again, phase from a probe
    (a group's follower, which serves no HTTP: ready, by its process alone);
    crash-loop recorded -> still crash-loop; otherwise failed ("engine gone while the
    agent was down") and the restart policy. Never starts a process itself."""
    engine.health = runner.tracker()
    if engine.phase == P.CRASH_LOOP:
        engine.reason = "gave up before the agent restarted (too many crashes)"
        runner.emit(engine)
        return
    proc = process.matching_process(engine.pid, engine.create_time)
    if proc is not None:
        # Not our child: its exit is seen by psutil and its exit code is unknown. Being on
        # the port is not required (pid + create time already identify it): vLLM binds the
        # port early but listens only once the model is loaded.
        engine.adopted = True
        if engine.spec.follower and engine.spec.group is not None:  # headless: no port
            words = member_words(engine.spec.group)
            engine.set_phase(P.READY, f"re-adopted after an agent restart ({words} alive)")
            runner.emit(engine)
            return
        port = engine.spec.port
        where = f"on port {port}" if process.uses_port(proc, port) else f"not yet on port {port}"
        engine.set_phase(
            _probe_phase(runner, engine), f"re-adopted after an agent restart ({where})"
        )
        runner.emit(engine)
        return
    if engine.phase == P.BACKOFF:
        engine.backoff_until = time.monotonic()
        engine.set_phase(P.BACKOFF, "restart pending from before the agent restarted")
        runner.emit(engine)
        return
    if engine.pid is not None:
        process.kill_group_now(engine.pid, engine.create_time)
    runner.capture_tail(engine)
    runner.crashed(engine, "engine gone while the agent was down (exit code unknown)")


def _probe_phase(runner: Runner, engine: Engine) -> str:
    spec, timeout = engine.spec, runner.s.probe_timeout_s
    if not probes.port_accepts(spec.host, spec.port, timeout):
        return P.STARTING
    key = spec.api_key
    healthy, _ = probes.probe_health(spec.host, spec.port, timeout, key)
    if (
        healthy
        and probes.probe_models(spec.host, spec.port, spec.served_model_name, timeout, key)[0]
    ):
        engine.metrics = probes.scrape_metrics(spec.host, spec.port, timeout, key)
        return P.READY
    return P.LOADING
