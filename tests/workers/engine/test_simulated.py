"""The simulated engine (agents with simulated NPUs): the phases of a real engine, through the
same supervisor and reports, labelled SIMULATED, and never a process."""

from __future__ import annotations

import json
import subprocess

import psutil
import pytest

from tests.workers.engine.helpers import wait_for
from workers.contracts import EnginePhase as P
from workers.engine.simulated import LABEL

FAST = {P.STARTING: 0.05, P.LOADING: 0.1}


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture
def no_popen(monkeypatch):
    """Any attempt to start a process fails the test (even one that would exit at once)."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a simulated engine started a process: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)


@pytest.fixture
def simulated(supervisor):
    """make(**overrides) -> a Supervisor simulating its engines, with short phases."""

    def make(**overrides):
        return supervisor(**{"simulated": True, "simulated_phase_s": FAST, **overrides})

    return make


def log_lines(report) -> list[str]:
    return open(report.log_path).read().splitlines()


def test_simulated_start_reaches_ready_without_any_process(simulated, spec, reports, no_popen):
    before = children()
    sup = simulated()
    first = sup.start(spec(npu_ids=[0, 1]))
    assert first.phase == P.STARTING and first.pid is None
    ready = reports.wait(P.READY, timeout=5)
    assert reports.phases() == [P.STARTING, P.LOADING, P.READY]
    assert not children() - before  # no new child (others of this test run may end meanwhile)
    assert ready.pid is None and ready.exit_code is None and ready.metrics == {}
    assert all(r.reason.startswith(LABEL) for r in reports.items)
    assert "nothing listens on port" in ready.reason
    state = json.loads((sup.state_dir / "engines/1/state.json").read_text())
    assert state["phase"] == P.READY and state["pid"] is None


def test_every_log_line_of_a_simulated_engine_says_so(simulated, spec, reports):
    sup = simulated()
    sup.start(spec())
    ready = reports.wait(P.READY, timeout=5)
    lines = log_lines(ready)
    assert ready.log_path.endswith("engines/1/gen1-run1.log")
    assert len(lines) >= 4 and all(LABEL in line for line in lines)
    assert "no process is started" in lines[0]
    tail = sup.log_tail(1)
    assert tail["path"] == ready.log_path and "ready: " in tail["text"]


def test_simulated_stop_reaches_stopped_and_forgets_the_engine(simulated, spec, reports):
    sup = simulated()
    sup.start(spec())
    reports.wait(P.READY, timeout=5)
    stopped = sup.stop(1)
    assert stopped.phase == P.STOPPED and stopped.reason.startswith(LABEL)
    assert reports.phases()[-2:] == [P.STOPPING, P.STOPPED]
    assert not (sup.state_dir / "engines/1/state.json").exists()
    assert sup.reports() == []
    again = sup.stop(1)  # idempotent, and still labelled (the supervisor's own "not running")
    assert again.phase == P.STOPPED and again.reason == f"{LABEL}: not running"
    assert all(LABEL in line for line in log_lines(stopped))


def test_a_simulated_stop_while_starting_never_becomes_ready(simulated, spec, reports):
    sup = simulated(simulated_phase_s={P.STARTING: 60.0})
    sup.start(spec())
    assert sup.stop(1).phase == P.STOPPED
    sup.check_all()
    assert P.READY not in reports.phases() and reports.phases()[-1] == P.STOPPED


def test_refusals_are_those_of_a_real_engine_and_labelled(simulated, spec, tmp_path):
    sup = simulated()
    missing = sup.start(spec(model_path=str(tmp_path / "nowhere")))
    assert missing.phase == P.FAILED and missing.reason.startswith(LABEL)
    assert "does not exist" in missing.reason
    sup.start(spec(replica_id=2, port=9100))
    taken = sup.start(spec(replica_id=3, port=9100))
    assert taken.phase == P.FAILED and "already used by replica 2" in taken.reason


def test_an_agent_restart_resumes_the_simulated_engine_where_it_was(
    simulated, spec, reports, no_popen
):
    sup = simulated()
    sup.start(spec())
    ready = reports.wait(P.READY, timeout=5)
    sup.shutdown()
    before = children()
    restarted = simulated()
    (adopted,) = restarted.adopt()
    assert adopted.phase == P.READY and "re-adopted" in adopted.reason
    assert adopted.reason.startswith(LABEL) and adopted.log_path == ready.log_path  # same run
    assert not children() - before
    assert restarted.start(spec()).phase == P.READY  # the same generation changes nothing
    assert restarted.stop(1).phase == P.STOPPED


def test_an_agent_restart_while_loading_resumes_loading(simulated, spec, reports):
    sup = simulated(simulated_phase_s={P.STARTING: 0.01, P.LOADING: 60.0})
    sup.start(spec())
    reports.wait(P.LOADING, timeout=5)
    wait_for(
        lambda: "loading" in (sup.state_dir / "engines/1/state.json").read_text(), 5, "persisted"
    )
    sup.shutdown()
    (adopted,) = simulated(simulated_phase_s={P.LOADING: 0.05}).adopt()
    assert adopted.phase == P.LOADING
    reports.wait(P.READY, timeout=5)


def test_a_new_generation_replaces_the_simulated_engine(simulated, spec, reports):
    sup = simulated()
    sup.start(spec())
    reports.wait(P.READY, timeout=5)
    second = sup.start(spec(generation=2))
    assert second.generation == 2 and second.phase == P.STARTING
    assert reports.phases(generation=1)[-1] == P.STOPPED
    wait_for(lambda: reports.phases(generation=2)[-1:] == [P.READY], 5, "generation 2 ready")
