"""Node checks: the console asks a host agent to run them; the agent answers with results."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.inventory.models import CheckRunStatus, Node, NodeCheckRun
from console.inventory.services import get_node
from workers.contracts import CheckReport, CheckResult, Tasks, describe

log = logging.getLogger(__name__)
ANSWER_TIMEOUT = timedelta(seconds=60)
MAX_CLOCK_SKEW_S = 2.0


class NodeNotRegistered(Exception):
    """A report for a node the console does not know (yet): its first beat may be in flight."""


def request_checks(*, actor: Actor, name: str) -> NodeCheckRun:
    """Record a check run and send it to the node's agent after the transaction commits."""
    check_role(actor, Role.OPERATOR)
    node = get_node(name)
    with transaction.atomic():
        run = NodeCheckRun.objects.create(node=node, requested_by=actor.name[:150])
        record(actor=actor, action="node.run_checks", obj=node)
        transaction.on_commit(lambda: _dispatch(node, run.pk))
    return run


def _dispatch(node: Node, run_id: int) -> None:
    from console.inventory.commands import send_command

    send_command(node.name, Tasks.HOST_RUN_CHECKS, [run_id])


def clock_skew_check(sent_at: datetime, received_at: datetime) -> CheckResult:
    skew = (received_at - sent_at).total_seconds()
    ok = abs(skew) <= MAX_CLOCK_SKEW_S
    return CheckResult(
        name="clock-skew",
        ok=ok,
        evidence=f"agent clock is {-skew:+.2f}s from the console's (incl. queue delay)",
        fix=""
        if ok
        else "sync the host clock: `chronyc tracking`, then `chronyc makestep`; "
        "multi-node HCCL jobs and log correlation need clocks within a second",
    )


def _skew_times(report: CheckReport, received_at: datetime) -> tuple[datetime, datetime]:
    """(sent, received) for the clock-skew check: the node's latest heartbeat when there is
    one (ingested within milliseconds of arriving), else this report, whose delivery may have
    waited in a retry."""
    from console.telemetry.services import latest

    try:
        beat = latest(report.node)
    except Exception:  # noqa: BLE001 - Redis down: fall back to the report itself
        beat = None
    if beat and beat.get("sent_at") and beat.get("received_at"):
        return datetime.fromisoformat(beat["sent_at"]), datetime.fromisoformat(beat["received_at"])
    return report.sent_at, received_at


def store_results(payload: dict, *, received_at: datetime | None = None) -> NodeCheckRun | None:
    """Store an agent's report on its run (or a new run for agent-start checks). Idempotent."""
    received_at = received_at or timezone.now()
    try:
        report = CheckReport.model_validate(payload)
    except ValidationError as exc:
        log.warning("check report refused: %s", describe(exc))
        return None
    node = Node.objects.filter(name=report.node).first()
    if node is None:
        raise NodeNotRegistered(report.node)
    results = [*report.results, clock_skew_check(*_skew_times(report, received_at))]
    status = CheckRunStatus.PASSED if all(r.ok for r in results) else CheckRunStatus.FAILED
    with transaction.atomic():
        run = None
        if report.run_id is not None:
            run = (
                NodeCheckRun.objects.select_for_update().filter(pk=report.run_id, node=node).first()
            )
        if run is None:
            run = NodeCheckRun(
                node=node,
                trigger=report.trigger,
                requested_by=f"agent {node.name}",
                requested_at=report.sent_at,
            )
        run.results = [r.model_dump() for r in results]
        run.status = status
        run.finished_at = received_at
        run.save()
    return run


def expire_check_runs(now: datetime | None = None) -> int:
    """Pending runs nobody answered within ANSWER_TIMEOUT become `timeout`."""
    now = now or timezone.now()
    return NodeCheckRun.objects.filter(
        status=CheckRunStatus.PENDING, requested_at__lt=now - ANSWER_TIMEOUT
    ).update(status=CheckRunStatus.TIMEOUT, finished_at=now)
