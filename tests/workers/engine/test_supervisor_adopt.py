"""An agent restart: a new Supervisor on the same state_dir takes its engines back."""

from __future__ import annotations

import json
import os
import signal

from tests.workers.engine.helpers import Reports, alive, wait_for
from workers.contracts import EnginePhase as P


def test_shutdown_leaves_the_engine_running_and_adopt_takes_it_back(supervisor, spec, reports):
    first = supervisor()
    started = first.start(spec())
    reports.wait(P.READY)
    first.shutdown()
    assert alive(started.pid)  # engines outlive the agent

    again = Reports()
    second = supervisor(report=again)
    adopted = second.adopt()
    assert [(r.phase, r.pid) for r in adopted] == [(P.READY, started.pid)]
    assert f"re-adopted after an agent restart (on port {started.port})" == adopted[
        0
    ].reason and again.phases() == [P.READY]
    assert sorted(p.name for p in (second.state_dir / "engines/1").glob("*.log")) == [
        "gen1-run1.log"
    ]  # no second engine
    assert second.start(spec(port=started.port)).pid == started.pid  # idempotent after adopt

    os.killpg(started.pid, signal.SIGKILL)  # the engine dies under the new agent
    failed = again.wait(P.FAILED)
    assert failed.exit_code is None and "exit code unknown" in failed.reason
    restarted = wait_for(lambda: [r for r in second.reports() if r.phase == P.READY], 10)
    assert restarted[0].pid != started.pid and restarted[0].restarts == 1
    assert restarted[0].log_path.endswith("gen1-run2.log")


def test_engine_gone_while_the_agent_was_down_is_failed_then_restarted(supervisor, spec, reports):
    first = supervisor()
    started = first.start(spec())
    reports.wait(P.READY)
    first.shutdown()
    os.killpg(started.pid, signal.SIGKILL)
    wait_for(lambda: not alive(started.pid), 5, "the engine to die")

    again = Reports()
    second = supervisor(report=again)
    second.adopt()
    failed = again.wait(P.FAILED)
    assert failed.reason == "engine gone while the agent was down (exit code unknown)"
    assert again.phases()[:2] == [P.FAILED, P.BACKOFF]
    again.wait(P.READY)


def test_reused_pid_with_another_create_time_is_not_adopted(supervisor, spec, reports):
    first = supervisor()
    started = first.start(spec(restart_max=1))
    reports.wait(P.READY)
    first.shutdown()
    os.killpg(started.pid, signal.SIGKILL)
    wait_for(lambda: not alive(started.pid), 5, "the engine to die")
    state_file = first.state_dir / "engines/1/state.json"
    state = json.loads(state_file.read_text())
    state["pid"] = os.getpid()  # a live process that is not the engine
    state_file.write_text(json.dumps(state))

    again = Reports()
    supervisor(report=again).adopt()
    assert again.phases() == [P.FAILED, P.CRASH_LOOP]
    assert alive(os.getpid())  # nothing was killed by mistake


def test_crash_loop_survives_an_agent_restart(supervisor, spec, reports):
    first = supervisor()
    first.start(spec(restart_max=1, extra_env={"FAKE_CRASH_AFTER_S": "0.2"}))
    reports.wait(P.CRASH_LOOP)
    first.shutdown()
    again = Reports()
    adopted = supervisor(report=again).adopt()
    assert [r.phase for r in adopted] == [P.CRASH_LOOP] and again.phases() == [P.CRASH_LOOP]


def test_stop_of_a_replica_not_adopted_still_ends_its_engine(supervisor, spec, reports):
    first = supervisor()
    started = first.start(spec())
    reports.wait(P.READY)
    first.shutdown()
    stopped = supervisor(report=Reports()).stop(1, 1)  # no adopt() first
    assert stopped.phase == P.STOPPED and not alive(started.pid)
    assert not (first.state_dir / "engines/1/state.json").exists()


def test_adopt_probes_a_keyed_engine_with_its_key(supervisor, spec, reports):
    key = "adopt-key-0123456789abcdef"
    first = supervisor()
    started = first.start(spec(api_key=key))
    reports.wait(P.READY)
    first.shutdown()
    second = supervisor(report=Reports())
    assert [(r.phase, r.pid) for r in second.adopt()] == [(P.READY, started.pid)]
