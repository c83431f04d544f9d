"""Node check reports: stored per run, the agent's clock measured NTP-style by the console,
early reports retried."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from console.inventory.checks import (
    ClockOffset,
    NodeNotRegistered,
    clock_offset,
    finish_clock_check,
    measure_clock,
    store_results,
)
from console.inventory.models import NodeCheckRun
from tests.factories import make_node


def report(node: str, sent_at: datetime, run_id=None, ok=True) -> dict:
    return {
        "node": node,
        "run_id": run_id,
        "trigger": "agent-start",
        "sent_at": sent_at.isoformat(),
        "results": [
            {"name": "npu-smi", "ok": ok, "evidence": "answered", "fix": "" if ok else "fix it"}
        ],
    }


def skew(run: NodeCheckRun) -> dict:
    return next(r for r in run.results if r["name"] == "clock-skew")


# --- the clock: NTP-style over host.ping ------------------------------------------------------
def test_clock_offset_is_ntps_and_its_bound_covers_any_split_of_the_delay():
    # symmetric 10 ms each way, agent 2 s ahead, 1 ms spent answering
    exact = clock_offset(t0=100.0, t1=102.010, t2=102.011, t3=100.021)
    assert exact.offset_s == pytest.approx(2.0) and exact.bound_s == pytest.approx(0.010)
    assert exact.skewed is False  # 2.0 s is the limit itself, not beyond it
    # the same clocks, the ping waiting 3 s in the command queue: the estimate moves by half
    # the wait, the bound grows by as much: the true offset (2 s) stays inside the interval
    queued = clock_offset(t0=100.0, t1=105.0, t2=105.001, t3=103.011)
    assert queued.offset_s - queued.bound_s <= 2.0 <= queued.offset_s + queued.bound_s
    assert not queued.skewed
    # equal clocks, the answer waiting 4 s on its way back: never reads as skew
    late = clock_offset(t0=0.0, t1=0.01, t2=0.011, t3=4.02)
    assert late.offset_s == pytest.approx(-2.0, abs=0.01) and not late.skewed
    # 30 s behind, well measured: skewed
    assert clock_offset(t0=0.0, t1=-29.99, t2=-29.98, t3=0.03).skewed


def finish(run: NodeCheckRun, offset: ClockOffset) -> NodeCheckRun:
    return finish_clock_check(run.pk, measure=lambda node: offset)


@pytest.mark.django_db
def test_a_report_stays_pending_until_the_clock_is_measured_then_finishes():
    make_node("n1")
    now = datetime.now(UTC)
    run = store_results(report("n1", now), received_at=now)
    assert run.status == "pending" and skew(run)["evidence"].startswith("measuring")
    done = finish(run, ClockOffset(0.004, 0.001, 0.002))
    assert done.status == "passed" and skew(done)["ok"]
    assert skew(done)["evidence"].startswith("agent clock is +0.00s ± 0.001s")
    assert finish(done, ClockOffset(99.0, 0.0, 0.0)) is None  # finished: left alone


@pytest.mark.django_db
def test_a_skewed_measurement_fails_the_run_with_a_fix_and_no_answer_fails_it_too():
    from console.inventory.commands import NoAnswer

    make_node("skewed")
    now = datetime.now(UTC)
    run = finish(
        store_results(report("skewed", now), received_at=now), ClockOffset(-30, 0.01, 0.02)
    )
    assert run.status == "failed" and not skew(run)["ok"] and "chronyc" in skew(run)["fix"]
    assert skew(run)["evidence"].startswith("agent clock is -30.00s")

    def silent(node):
        raise NoAnswer("the agent on skewed did not answer within 5s")

    again = store_results(report("skewed", now), received_at=now)
    again = finish_clock_check(again.pk, measure=silent)
    assert again.status == "failed" and "did not answer" in skew(again)["evidence"]


@pytest.fixture
def answering_agent(db, redis_url, tmp_path, monkeypatch):
    """The real agent's command loop (workers/agent.py) on the test Redis, for an enrolled
    node; `shift(seconds)` moves the agent's clock, `busy(seconds)` delays every ping."""
    from tests.node_support import enroll_node
    from workers import agent as agent_mod
    from workers.config import AgentConfig

    identity = enroll_node("clock-n1")
    (tmp_path / "agent").mkdir()
    config = AgentConfig.from_env(
        {
            "NPU_AGENT_BROKER_URL": redis_url,
            "NPU_AGENT_NODE_NAME": identity.node,
            "NPU_AGENT_STATE_DIR": str(tmp_path / "agent"),
        }
    )
    agent = agent_mod.Agent(config, identity)
    thread = threading.Thread(target=agent_mod.command_loop, args=(agent,), daemon=True)
    thread.start()
    control = SimpleNamespace(node=identity.node, agent=agent)
    control.shift = lambda s: monkeypatch.setattr(agent_mod, "wall_clock", lambda: time.time() + s)
    yield control
    agent.stop.set()
    thread.join(5)


@pytest.mark.django_db
def test_a_report_that_waited_in_the_inbox_measures_no_skew(answering_agent):
    """The bug this replaced: the report's sent_at against the time the inbox handled it read
    an inbox queue of 5 s as a 5 s skew (-3.29 s was seen with console and agent on one
    host). The clock is now measured by pings, whatever the report waited."""
    sent = datetime.now(UTC) - timedelta(seconds=5)
    run = store_results(report(answering_agent.node, sent), received_at=sent + timedelta(seconds=5))
    done = finish_clock_check(run.pk)
    offset = float(skew(done)["evidence"].split()[3].rstrip("s"))
    assert done.status == "passed" and abs(offset) < 0.05, skew(done)


@pytest.mark.django_db
def test_an_agent_with_a_skewed_clock_is_reported_skewed(answering_agent):
    answering_agent.shift(-30.0)  # the agent's clock runs 30 s behind
    measured = measure_clock(answering_agent.node)
    assert measured.offset_s == pytest.approx(-30.0, abs=0.05) and measured.skewed
    assert measured.bound_s < 0.05
    now = datetime.now(UTC)
    done = finish_clock_check(store_results(report(answering_agent.node, now)).pk)
    assert done.status == "failed" and skew(done)["evidence"].startswith("agent clock is -30.0")


@pytest.mark.django_db
def test_a_report_answers_its_run_and_a_repeat_changes_nothing(operator):
    node = make_node("n1")
    run = NodeCheckRun.objects.create(node=node, requested_by="otto")
    now = datetime.now(UTC)
    for _ in range(2):
        stored = store_results(report("n1", now, run_id=run.pk), received_at=now)
    assert stored.pk == run.pk and NodeCheckRun.objects.count() == 1
    finish(stored, ClockOffset(0.0, 0.001, 0.002))
    assert NodeCheckRun.objects.get(pk=run.pk).status == "passed"


@pytest.mark.django_db
def test_a_report_before_registration_asks_to_be_retried():
    with pytest.raises(NodeNotRegistered):
        store_results(report("not-yet", datetime.now(UTC)))


@pytest.mark.django_db
def test_garbage_reports_are_refused_without_storing():
    assert store_results({"node": "n1", "results": "nope"}) is None
    assert not NodeCheckRun.objects.exists()
