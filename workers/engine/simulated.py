"""The simulated engine: what an agent with simulated NPUs runs instead of vLLM.

An agent whose accelerators are the simulated provider's (`python -m workers agent
--simulated`, the second node of `make demo`) has no NPUs and, as a rule, no vLLM: a real
`python -m vllm…` there can only crash-loop. `SimulatedRunner` takes the real runner's place in
the same `Supervisor` (never on a host whose NPUs are real: see `workers.agent.simulated_node`)
and plays the lifecycle a real engine goes through, on the monitor's clock:

  starting --(phase_s["starting"])--> loading --(phase_s["loading"])--> ready
  stop(): -> stopping -> stopped

Reports go through the same callback (`EngineReport`, the console's replica states and
events), the state file and the run log file keep their places under the state dir, so the
console shows the phases, the timeline and the live log as for a real engine. It starts no
process, sends no signal and binds no port: its reports carry no pid, and "ready" means only
that the simulation got there — nothing answers on the port (the console's gateway does not
route to replicas on simulated nodes). Every reason and every log line says SIMULATED.

Across the agent's own lifecycle it keeps what a real engine keeps: a real engine outlives its
agent and is re-adopted, so a simulated one resumes the phase its state file recorded
(`adopt`). A stop removes the state file, as the real one does.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from workers.contracts import EnginePhase as P
from workers.contracts import EngineReport, EngineSpec
from workers.engine import logs
from workers.engine.runner import Runner, Settings
from workers.engine.state import Engine, remove_state

log = logging.getLogger("workers.engine")
LABEL = "SIMULATED"
# Short, so a demo reaches ready in seconds (a real engine takes from 30 s on a tiny CPU model
# to many minutes for a large model on NPUs); the monitor's interval rounds them up.
PHASE_S = {P.STARTING: 2.0, P.LOADING: 6.0}
_NEXT = {P.STARTING: P.LOADING, P.LOADING: P.READY}
_RESUMABLE = (P.STARTING, P.LOADING, P.READY)


def labelled(text: str) -> str:
    """`text` starting with the SIMULATED label (unchanged when it already does)."""
    return text if text.startswith(LABEL) else f"{LABEL}: {text}" if text else LABEL


class SimulatedRunner(Runner):
    """A Runner that simulates engines instead of running them (see the module docstring).

    phase_s: seconds spent in starting and in loading before the next phase (PHASE_S by
    default). Every step of the real runner that would touch a process or a port is
    overridden (refusal, spawn, tick, stop, end_processes, adopt); nothing here spawns,
    signals or probes anything.
    """

    def __init__(self, settings: Settings, phase_s: Mapping[str, float] | None = None) -> None:
        super().__init__(settings)
        self.phase_s = {**PHASE_S, **(phase_s or {})}

    # --- reporting -----------------------------------------------------------------------
    def send(self, report: EngineReport) -> EngineReport:
        """As Runner.send, the reason labelled SIMULATED whoever wrote it (the supervisor's
        own "not running" for a stop of an unknown replica included)."""
        if not report.reason.startswith(LABEL):
            report = report.model_copy(update={"reason": labelled(report.reason)})
        return super().send(report)

    def transition(self, engine: Engine, phase: str, reason: str = "") -> None:
        reason = labelled(reason)
        if engine.phase != phase or engine.reason != reason:
            self.say(engine, f"{phase}: {reason.removeprefix(LABEL + ': ')}")
        super().transition(engine, phase, reason)

    def say(self, engine: Engine, text: str) -> None:
        """Append one line, labelled SIMULATED, to the engine's run log (what the log shipper
        sends and the live log shows). A failed write is recorded like the real runner's."""
        if engine.log_path is None:
            return
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        line = f"{stamp} {LABEL} replica {engine.replica_id} gen {engine.generation}: {text}\n"
        try:
            fd = logs.open_for_engine(engine.log_path)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            self.wrote(engine.log_path, exc)

    # --- start ---------------------------------------------------------------------------
    def refusal(self, spec: EngineSpec, ports_in_use: dict[int, int]) -> str | None:
        """What a real engine would be refused for: a model directory without config.json, a
        port another engine of this supervisor holds. The host's bind test is not made: a
        simulated engine binds nothing."""
        path = Path(spec.model_path)
        if not path.is_dir():
            return labelled(f"model path {path} does not exist or is not a directory")
        if not (path / "config.json").is_file():
            return labelled(f"model path {path} has no config.json")
        if spec.port in ports_in_use:
            return labelled(
                f"port {spec.port} is already used by replica {ports_in_use[spec.port]}"
            )
        return None

    def spawn(self, engine: Engine) -> bool:
        """A new simulated run (a new log file): report `starting`. Starts no process."""
        engine.run = logs.next_run(engine.directory, engine.generation)
        engine.log_path = logs.run_log_path(engine.directory, engine.generation, engine.run)
        engine.proc = engine.pid = engine.create_time = None
        engine.adopted, engine.stop_requested, engine.terminating = False, False, None
        engine.exit_code = engine.signal = None
        engine.metrics, engine.log_tail, engine.health = {}, [], self.tracker()
        engine.phase_since = time.monotonic()  # starting's clock runs from this run
        spec = engine.spec
        npus = ",".join(map(str, spec.npu_ids)) or "-"
        self.say(
            engine,
            f"run {engine.run}: no process is started — this node's NPUs are simulated "
            f"(replayed npu-smi captures). Would serve {spec.served_model_name} from "
            f"{spec.model_path} on {spec.host}:{spec.port}, NPUs {npus}",
        )
        logs.prune(engine.directory, self.s.log_keep)
        self.transition(engine, P.STARTING, f"run {engine.run}, no process (simulated NPUs)")
        self.persist(engine)
        return True

    # --- stop ----------------------------------------------------------------------------
    def end_processes(self, engine: Engine) -> str:
        """Nothing to end: a simulated engine has no process. A pid in a state file is never
        signalled from here (it would be a real runner's record)."""
        return "gone"

    def stop(self, engine: Engine, reason: str) -> None:
        """stopping -> stopped, the state file removed. Nothing to signal, no port to free."""
        engine.stop_requested = True
        engine.log_tail, engine.exit_code, engine.signal = [], None, None
        self.transition(engine, P.STOPPING, reason)
        remove_state(engine.directory)
        self.transition(engine, P.STOPPED, f"{reason} (no process to end)")

    # --- the monitor's step --------------------------------------------------------------
    def tick(self, engine: Engine) -> None:
        """Move starting -> loading -> ready once each phase's time has passed (persisted,
        so an agent restart resumes there)."""
        if engine.stop_requested or engine.phase not in _NEXT:
            return
        if time.monotonic() - engine.phase_since < self.phase_s.get(engine.phase, 0.0):
            return
        port = engine.spec.port
        if engine.phase == P.STARTING:
            self.transition(engine, P.LOADING, f"port {port} would answer now; nothing is loaded")
        else:
            why = f"nothing listens on port {port} (the gateway skips it)"
            self.transition(engine, P.READY, f"no engine: {why}")
        self.persist(engine)

    # --- an agent restart ----------------------------------------------------------------
    def adopt(self, engine: Engine) -> None:
        """Resume an engine read from its state file in the phase it recorded (a real engine
        outlives its agent and is re-adopted; this one "outlived" it too). A phase it never
        records (it persists only starting, loading, ready) starts a new run instead."""
        engine.health = self.tracker()
        if engine.pid is not None:
            log.warning(
                "replica %s: state recorded pid %s; a simulated agent leaves it alone",
                engine.replica_id,
                engine.pid,
            )
        engine.proc = engine.pid = engine.create_time = None
        if engine.phase not in _RESUMABLE or engine.log_path is None:
            engine.phase = ""  # so that spawn's `starting` is a change, and reported
            self.spawn(engine)
            return
        engine.adopted = True
        phase, engine.phase = engine.phase, ""  # report the resumed phase as a change
        self.transition(engine, phase, "re-adopted after an agent restart")
