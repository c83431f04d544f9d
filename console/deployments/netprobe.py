"""Network probes between the members of a multi-host replica, as a record and a poll (the way
model inspections work, console/deployments/inspection.py): nothing waits on an agent.

`request` records a `NetProbe` for one member and its targets and sends `host.net_probe`
(probe id, targets) once the transaction commits; the agent runs them (workers/netprobe.py)
and answers on the inbox (`console.net_probe`, authenticated there); `store_answer` writes
the answer on the record, only for the node it was asked of. groups.check_connectivity
decides what the answers mean for the start.

A done probe is reused for FRESH with the same targets; a failed one (the agent could not be
asked, or did not answer) for FAILED_FRESH only. Answers whose ping failed are kept FRESH too:
the operator fixes the link, then the next ask (after FRESH) sees it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from console.deployments.inspection import fail_pending, send_or_fail
from console.deployments.models import InspectionStatus, NetProbe, Replica
from console.inventory.models import Node
from workers.contracts import NetProbeReport, ProbeTarget, Tasks

FRESH = timedelta(seconds=60)
FAILED_FRESH = timedelta(seconds=10)
ANSWER_TIMEOUT = timedelta(seconds=45)  # the agent answers within ~15 s (workers/netprobe.py)
KEEP = timedelta(days=1)  # older records are deleted when a new one is written


def request(replica: Replica, node: Node, targets: list[dict]) -> NetProbe:
    """The probe of `targets` from `node` for `replica` to wait for: a fresh answer, the
    pending ask, or a new ask (recorded, then sent once the transaction commits)."""
    targets = [ProbeTarget.model_validate(t).model_dump() for t in targets]
    now = timezone.now()
    latest = (
        NetProbe.objects.filter(
            replica=replica, node=node, generation=replica.generation, targets=targets
        )
        .select_related("node")
        .order_by("-requested_at", "-pk")
        .first()
    )
    if latest is not None:
        _expire(latest, now)
        if latest.status == InspectionStatus.PENDING:
            return latest
        fresh = FRESH if latest.status == InspectionStatus.DONE else FAILED_FRESH
        if latest.answered_at and latest.answered_at >= now - fresh:
            return latest
    NetProbe.objects.filter(requested_at__lt=now - KEEP).delete()
    probe = NetProbe.objects.create(
        replica=replica, node=node, generation=replica.generation, targets=targets
    )
    transaction.on_commit(lambda: _send(probe))
    return probe


def _send(probe: NetProbe) -> None:
    send_or_fail(probe, Tasks.HOST_NET_PROBE, [probe.pk, probe.targets], "network probe")


_finish = fail_pending


def _expire(probe: NetProbe, now: datetime) -> None:
    if probe.status == InspectionStatus.PENDING and probe.requested_at < now - ANSWER_TIMEOUT:
        _finish(
            probe,
            f"the agent did not answer the network probe within "
            f"{ANSWER_TIMEOUT.total_seconds():g}s (offline, busy, or older than this console)",
        )


def target_key(target: dict) -> tuple:
    """ProbeTarget.key() of a target or a result as stored."""
    return ProbeTarget.model_validate(
        {k: target[k] for k in ("kind", "address", "npu", "port", "hccs") if k in target}
    ).key()


def results_by_target(probe: NetProbe) -> dict[tuple, dict]:
    """The answer of a done probe, by ProbeTarget.key()."""
    return {target_key(r): r for r in probe.results or []}


def store_answer(report: NetProbeReport, *, node: str, answered_at: datetime | None = None) -> bool:
    """Write the agent's answer on the probe it was asked (`node`: the authenticated sender).
    Idempotent: only a pending record changes. False when this node was never asked this
    probe (the inbox refuses it: NodeRestriction). Results for targets that were not asked
    are dropped."""
    asked = NetProbe.objects.filter(pk=report.probe_id, node__name=node).first()
    if asked is None:
        return False
    wanted = {ProbeTarget.model_validate(t).key() for t in asked.targets}
    results = [
        r.model_dump(mode="json")
        for r in report.results
        if ProbeTarget.model_validate(r.model_dump(exclude={"ok", "detail"})).key() in wanted
    ]
    NetProbe.objects.filter(pk=asked.pk, status=InspectionStatus.PENDING).update(
        status=InspectionStatus.DONE, results=results, answered_at=answered_at or timezone.now()
    )
    return True
