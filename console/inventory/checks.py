"""Node checks: the console asks a host agent to run them; the agent answers with results."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone
from pydantic import ValidationError

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.inventory.models import CheckRunStatus, Node, NodeCheckRun
from console.inventory.services import get_node
from workers.contracts import CheckReport, CheckResult, ClockReading, Tasks, describe

log = logging.getLogger(__name__)
ANSWER_TIMEOUT = timedelta(seconds=60)
MAX_CLOCK_SKEW_S = 2.0
CLOCK_SAMPLES = 3  # pings per measurement; the one with the shortest round trip is kept


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


@dataclass(frozen=True)
class ClockOffset:
    """How far the agent's clock is from the console's, NTP-style: the true offset lies in
    [offset_s - bound_s, offset_s + bound_s] whatever the delays on the way there and back."""

    offset_s: float  # + : the agent's clock is ahead
    bound_s: float  # half of round_trip_s
    round_trip_s: float  # t3 - t0 less the agent's own time between reading and answering

    @property
    def skewed(self) -> bool:
        """Beyond MAX_CLOCK_SKEW_S even at the near end of the interval."""
        return abs(self.offset_s) - self.bound_s > MAX_CLOCK_SKEW_S


def clock_offset(t0: float, t1: float, t2: float, t3: float) -> ClockOffset:
    """NTP's offset and its error bound from one exchange: the console sends at t0 (its
    clock), the agent reads it at t1 and answers at t2 (its clock), the console reads the
    answer at t3. With d1, d2 >= 0 the delays there and back and θ the true offset,
    t1 - t0 = θ + d1 and t3 - t2 = d2 - θ, so θ = offset - (d1 - d2)/2 with |d1 - d2| <= d1 + d2:
    a message that waits in a queue (either way) widens the bound, never fakes a skew."""
    delay = max(0.0, (t3 - t0) - (t2 - t1))
    return ClockOffset(((t1 - t0) + (t2 - t3)) / 2, delay / 2, delay)


def measure_clock(node: str, *, samples: int = CLOCK_SAMPLES, timeout: float = 5.0) -> ClockOffset:
    """Ping the node's agent `samples` times and keep the exchange with the shortest round
    trip (NTP's clock filter: the least-delayed exchange bounds the offset best). An agent
    that answers without its own times (older than contracts.ClockReading) is measured with
    the reply's envelope time standing for both t1 and t2 (still a true bound). Raises
    commands.NoAnswer when the agent does not answer."""
    from console.inventory.commands import timed_call

    best: ClockOffset | None = None
    for _ in range(samples):
        answer = timed_call(node, Tasks.HOST_PING, ["clock"], timeout=timeout)
        try:
            reading = ClockReading.model_validate(answer.body)
            t1, t2 = reading.received_at, reading.replied_at
        except ValidationError:  # an older agent: its reply's own time for both
            t1 = t2 = answer.replied_at
        measured = clock_offset(answer.sent_at, t1, t2, answer.read_at)
        if best is None or measured.round_trip_s < best.round_trip_s:
            best = measured
    assert best is not None
    return best


def clock_skew_check(offset: ClockOffset | None, why_not: str = "") -> CheckResult:
    """The clock-skew result. Its evidence starts `agent clock is ±N.NNs` (read back by
    console/deployments/preflight.py); it fails only when the offset is beyond
    MAX_CLOCK_SKEW_S at the near end of its error bound, or could not be measured."""
    if offset is None:
        return CheckResult(
            name="clock-skew",
            ok=False,
            evidence=f"not measured: {why_not or 'no answer'}",
            fix="run the checks again once the agent answers (node page, Run checks)",
        )
    ok = not offset.skewed
    return CheckResult(
        name="clock-skew",
        ok=ok,
        evidence=f"agent clock is {offset.offset_s:+.2f}s ± {offset.bound_s:.3f}s from the "
        f"console's (NTP-style ping, round trip {offset.round_trip_s * 1000:.1f} ms; limit "
        f"±{MAX_CLOCK_SKEW_S:g}s)",
        fix=""
        if ok
        else "sync the host clock: `chronyc tracking`, then `chronyc makestep`; "
        "multi-node HCCL jobs and log correlation need clocks within a second",
    )


MEASURING = CheckResult(
    name="clock-skew", ok=False, evidence="measuring: the console pings the agent", fix=""
)


def store_results(payload: dict, *, received_at: datetime | None = None) -> NodeCheckRun | None:
    """Store an agent's report on its run (or a new run for agent-start checks), the run
    staying `pending` until the console has measured the agent's clock (finish_clock_check,
    sent to a console worker once this commits). Idempotent."""
    received_at = received_at or timezone.now()
    try:
        report = CheckReport.model_validate(payload)
    except ValidationError as exc:
        log.warning("check report refused: %s", describe(exc))
        return None
    node = Node.objects.filter(name=report.node).first()
    if node is None:
        raise NodeNotRegistered(report.node)
    results = [r for r in report.results if r.name != MEASURING.name] + [MEASURING]
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
                # the console's clock: an agent's may be off by more than ANSWER_TIMEOUT,
                # which would expire the run before its clock is measured
                requested_at=received_at,
            )
        run.results = [r.model_dump() for r in results]
        run.status = CheckRunStatus.PENDING
        run.finished_at = None
        run.save()
        transaction.on_commit(lambda: _measure_later(run.pk))
    return run


def _measure_later(run_id: int) -> None:
    from console.inventory.tasks import measure_clock_skew

    measure_clock_skew.delay(run_id)


def finish_clock_check(
    run_id: int, *, measure: Callable[[str], ClockOffset] = measure_clock
) -> NodeCheckRun | None:
    """Measure the run's node clock and finish the run: its clock-skew result replaced, its
    status passed or failed. Idempotent: a run already finished is left alone (None)."""
    run = NodeCheckRun.objects.select_related("node").filter(pk=run_id).first()
    if run is None or run.status != CheckRunStatus.PENDING or not run.results:
        return None
    from console.inventory.commands import NoAnswer

    try:
        result = clock_skew_check(measure(run.node.name))
    except NoAnswer as exc:
        result = clock_skew_check(None, str(exc))
    with transaction.atomic():
        run = NodeCheckRun.objects.select_for_update().get(pk=run_id)
        if run.status != CheckRunStatus.PENDING:
            return None
        kept = [r for r in run.results if r.get("name") != result.name]
        run.results = [*kept, result.model_dump()]
        ok = all(r.get("ok") for r in run.results)
        run.status = CheckRunStatus.PASSED if ok else CheckRunStatus.FAILED
        run.finished_at = timezone.now()
        run.save(update_fields=["results", "status", "finished_at"])
    return run


def expire_check_runs(now: datetime | None = None) -> int:
    """Pending runs nobody answered within ANSWER_TIMEOUT become `timeout`."""
    now = now or timezone.now()
    return NodeCheckRun.objects.filter(
        status=CheckRunStatus.PENDING, requested_at__lt=now - ANSWER_TIMEOUT
    ).update(status=CheckRunStatus.TIMEOUT, finished_at=now)
