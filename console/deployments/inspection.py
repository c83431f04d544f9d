"""Model inspection as a record and a poll, the way node checks work: no web request waits on
an agent for more than about a second.

`request` records a `ModelInspection` and sends `host.model_inspect` (path, inspection id)
without waiting; the agent answers on the inbox (`console.model_inspection`, authenticated
there like every inbound message) and `store_answer` writes the answer on the record, only
for the node it was asked of. `result` returns the model as read, raises `Invalid` naming
`model_path` for a refused one, or `InspectionPending` (409, Retry-After) while the agent
has not answered within `WAIT_S`.

An answer is reused for `FRESH` (the agent's own cache per directory fingerprint makes asking
again cheap, and only the host can tell whether the directory changed); a refusal for
`FAILED_FRESH` only, as the operator is likely fixing the copy.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from console.deployments.models import InspectionStatus, ModelInspection
from console.errors import DomainError, Invalid, NotFound
from console.inventory.models import Node
from workers.contracts import InspectionReport, Tasks

log = logging.getLogger(__name__)
WAIT_S = 1.0  # the longest a request waits for the agent
FRESH = timedelta(seconds=60)
FAILED_FRESH = timedelta(seconds=5)
ANSWER_TIMEOUT = timedelta(seconds=30)  # then the pending record fails: the agent is away
KEEP = timedelta(days=1)  # older records are deleted when a new one is written
ERROR_MAX_CHARS = 2000


class InspectionPending(DomainError):
    """The agent has not answered yet: retry (409, not 202: nothing was created or changed,
    and a 2xx would read as success to clients that only check the status class)."""

    status = 409
    retry_after = 1

    def __init__(self, inspection: ModelInspection) -> None:
        self.inspection = inspection
        super().__init__(
            f"the agent on {inspection.node.name} is still inspecting the model "
            f"(inspection {inspection.pk}): retry in a second, or poll "
            f"GET /api/v1/deployments/inspections/{inspection.pk}",
            field="model_path",
        )

    def details(self) -> dict:
        return {"inspection": {"id": self.inspection.pk, "status": self.inspection.status}}


def request(node: Node, path: str) -> ModelInspection:
    """The inspection of `path` on `node` to wait for: a fresh answer, the pending ask, or a
    new ask (recorded, then sent once the transaction commits). Never waits on the agent."""
    now = timezone.now()
    latest = (
        ModelInspection.objects.filter(node=node, path=path)
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
    ModelInspection.objects.filter(requested_at__lt=now - KEEP).delete()
    inspection = ModelInspection.objects.create(node=node, path=path, requested_at=now)
    transaction.on_commit(lambda: _send(inspection))
    return inspection


def _send(inspection: ModelInspection) -> None:
    send_or_fail(
        inspection, Tasks.HOST_MODEL_INSPECT, [inspection.path, inspection.pk], "inspection"
    )


def send_or_fail(record, task: str, args: list, what: str) -> None:
    """Send the command a pending record (a ModelInspection or a NetProbe) waits on; when it
    cannot be sent, fail the record at once rather than let it wait out its timeout."""
    from redis import RedisError

    from console.inventory.commands import send_command

    node = record.node.name
    try:
        sent = send_command(node, task, args)
    except RedisError as exc:
        log.warning("%s %s not sent: %s", what, record.pk, exc)
        fail_pending(record, f"the {what} could not be queued for {node}: {exc}")
        return
    if sent is None:
        fail_pending(record, f"node {node} has no active credential: its agent cannot be asked")


def fail_pending(record, error: str) -> None:
    """Fail a pending record (one conditional UPDATE: an answer that got there first stays)
    and reload what it now says."""
    type(record).objects.filter(pk=record.pk, status=InspectionStatus.PENDING).update(
        status=InspectionStatus.FAILED, error=error[:ERROR_MAX_CHARS], answered_at=timezone.now()
    )
    record.refresh_from_db()


_finish = fail_pending


def _expire(inspection: ModelInspection, now: datetime) -> None:
    if (
        inspection.status == InspectionStatus.PENDING
        and inspection.requested_at < now - ANSWER_TIMEOUT
    ):
        seconds = ANSWER_TIMEOUT.total_seconds()
        _finish(
            inspection,
            f"the agent did not answer the model inspection within {seconds:g}s (offline or busy?)",
        )


def result(node: Node, path: str, wait: float = WAIT_S) -> dict:
    """The model at `path` as `node`'s agent read it, waiting at most `wait` seconds.
    Raises Invalid (field model_path) for a refused model or an agent that did not answer
    in time, InspectionPending while the answer is still expected."""
    inspection = request(node, path)
    deadline = time.monotonic() + min(wait, WAIT_S)
    pause = 0.02
    while inspection.status == InspectionStatus.PENDING:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.2)
        inspection.refresh_from_db(fields=["status", "info", "error", "answered_at"])
    return outcome(inspection)


def outcome(inspection: ModelInspection) -> dict:
    """The info of a done inspection; raises for a failed or pending one."""
    if inspection.status == InspectionStatus.DONE:
        return dict(inspection.info)
    if inspection.status == InspectionStatus.FAILED:
        raise Invalid(f"{inspection.error} (on {inspection.node.name})", field="model_path")
    raise InspectionPending(inspection)


def get(inspection_id: int) -> ModelInspection:
    """One inspection (a pending one past ANSWER_TIMEOUT is failed first). Raises NotFound."""
    inspection = ModelInspection.objects.select_related("node").filter(pk=inspection_id).first()
    if inspection is None:
        raise NotFound(f"no model inspection with id {inspection_id}", field="inspection_id")
    _expire(inspection, timezone.now())
    return inspection


def store_answer(
    report: InspectionReport, *, node: str, answered_at: datetime | None = None
) -> bool:
    """Write the agent's answer on the inspection it was asked (`node`: the authenticated
    sender). Idempotent: only a pending record changes. False when this node was never asked
    this inspection of this path (the inbox refuses it: NodeRestriction)."""
    asked = ModelInspection.objects.filter(
        pk=report.inspection_id, node__name=node, path=report.path
    )
    if not asked.exists():
        return False
    answer = report.result
    ok = answer.get("ok") is True
    error = "" if ok else str(answer.get("error") or "the agent cannot read the model")
    asked.filter(status=InspectionStatus.PENDING).update(
        status=InspectionStatus.DONE if ok else InspectionStatus.FAILED,
        info=answer,
        error=error[:ERROR_MAX_CHARS],
        fingerprint=str(answer.get("fingerprint") or "")[:64],
        mtime=_mtime(answer.get("mtime")),
        answered_at=answered_at or timezone.now(),
    )
    return True


def _mtime(value: object) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None
