"""Node check reports: stored per run, clock skew judged by the console, early reports retried."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.inventory.checks import NodeNotRegistered, store_results
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


@pytest.mark.django_db
def test_a_slow_clock_fails_the_skew_check_with_a_fix():
    from console.hot import get_redis
    from console.telemetry.services import latest_key

    make_node("skewed")
    get_redis().delete(latest_key("skewed"))  # no heartbeat to judge by: the report is used
    now = datetime.now(UTC)
    run = store_results(report("skewed", now - timedelta(seconds=30)), received_at=now)
    assert run.status == "failed" and not skew(run)["ok"] and "chronyc" in skew(run)["fix"]
    assert "+30.00s" in skew(run)["evidence"] or "-30.00s" in skew(run)["evidence"]


@pytest.mark.django_db
def test_a_report_answers_its_run_and_a_repeat_changes_nothing(operator):
    node = make_node("n1")
    run = NodeCheckRun.objects.create(node=node, requested_by="otto")
    now = datetime.now(UTC)
    for _ in range(2):
        stored = store_results(report("n1", now, run_id=run.pk), received_at=now)
    assert stored.pk == run.pk and NodeCheckRun.objects.count() == 1
    assert NodeCheckRun.objects.get(pk=run.pk).status == "passed"


@pytest.mark.django_db
def test_a_report_before_registration_asks_to_be_retried():
    with pytest.raises(NodeNotRegistered):
        store_results(report("not-yet", datetime.now(UTC)))


@pytest.mark.django_db
def test_garbage_reports_are_refused_without_storing():
    assert store_results({"node": "n1", "results": "nope"}) is None
    assert not NodeCheckRun.objects.exists()
