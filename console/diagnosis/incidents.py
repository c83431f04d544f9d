"""Incident services: open or fold incidents from engine failures and NPU health, act on them.

Openers (`open_incident_for_replica`, `open_incident_for_chip`, `chips_reported`) are called
from the engine-report and heartbeat paths; they never raise — a failure here is logged and
the caller carries on. Actions (acknowledge, note, resolve) need the operator role and write
one audit entry each, in the transaction that makes the change.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Case, Count, F, IntegerField, QuerySet, Value, When
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.deployments.masking import shown_lines
from console.diagnosis import webhooks
from console.diagnosis.matcher import diagnose
from console.diagnosis.models import Incident, IncidentNote, IncidentStatus, Severity
from console.errors import Conflict, Invalid, NotFound
from workers.engine.shipper import mask_secrets

log = logging.getLogger(__name__)

CONTEXT_LINES = 3
MAX_NOTE_CHARS = 5000
HOT_C = 85.0  # as console.inventory.live.HOT_C
ENGINE_CRASH = "engine-crash"
NPU_HEALTH = "npu-health"
OVER_TEMPERATURE = "over-temperature"


# --- opening and folding ------------------------------------------------------------------
def _open_or_fold(*, fingerprint: str, fields: dict, note: str = "") -> tuple[Incident, str]:
    """Fold into the unresolved incident with this fingerprint (one conditional UPDATE), or
    open a new one. Returns (incident, "opened" | "folded"). Safe under concurrency: the
    partial unique constraint lets only one opener win; the loser folds."""
    now = timezone.now()
    unresolved = Incident.objects.filter(fingerprint=fingerprint).exclude(
        status=IncidentStatus.RESOLVED
    )
    for _ in range(3):
        if unresolved.update(count=F("count") + 1, last_seen=now):
            return unresolved.get(), "folded"
        try:
            with transaction.atomic():
                incident = Incident.objects.create(
                    fingerprint=fingerprint, first_seen=now, last_seen=now, **fields
                )
                if note:
                    IncidentNote.objects.create(incident=incident, author="system", text=note)
            return incident, "opened"
        except IntegrityError:
            continue  # someone else opened it meanwhile: fold into theirs
    raise Conflict(f"could not open or fold incident {fingerprint}")


def _record_open(fingerprint: str, fields: dict, note: str = "") -> Incident | None:
    """Open or fold and announce it; logs and returns None on any failure."""
    try:
        with transaction.atomic():
            incident, event = _open_or_fold(fingerprint=fingerprint, fields=fields, note=note)
            webhooks.dispatch(incident.pk, event)
        return incident
    except Exception:  # noqa: BLE001 - an incident must never break a heartbeat or a report
        log.exception("could not record incident %s", fingerprint)
        return None


TAIL_WHEN_UNMATCHED = 20


def evidence_context(lines: list[str], diagnoses: list[dict]) -> list[dict]:
    """Each evidence line with CONTEXT_LINES lines either side, evidence lines marked `hit`."""
    hits = {ev["line"] for d in diagnoses for ev in d["evidence"] if ev["line"] is not None}
    blocks, shown = [], set()
    for d in diagnoses:
        for ev in d["evidence"]:
            n = ev["line"]
            if n is None or n in shown or n > len(lines):
                continue
            lo, hi = max(1, n - CONTEXT_LINES), min(len(lines), n + CONTEXT_LINES)
            shown.update(range(lo, hi + 1))
            context = [
                {"n": i, "text": lines[i - 1][:400], "hit": i in hits} for i in range(lo, hi + 1)
            ]
            blocks.append({"line": n, "rule": d["rule"], "context": context})
    if not blocks and lines:  # nothing pinned a line: show the lines it was opened from
        lo = max(1, len(lines) - TAIL_WHEN_UNMATCHED + 1)
        context = [
            {"n": i, "text": lines[i - 1][:400], "hit": False} for i in range(lo, len(lines) + 1)
        ]
        blocks.append({"line": lo, "rule": "", "context": context})
    return blocks


def telemetry_snapshot(node) -> dict | None:
    """The node's latest chips from the hot store, or None when unavailable."""
    if node is None:
        return None
    try:
        from console.telemetry.services import latest

        data = latest(node.name)
    except Exception:  # noqa: BLE001 - Redis down: the incident matters more than the snapshot
        log.warning("no telemetry snapshot for %s", node.name, exc_info=True)
        return None
    if not data:
        return None
    return {"received_at": data.get("received_at"), "chips": data.get("chips") or []}


def open_incident_for_replica(replica, report) -> Incident | None:
    """Diagnose a failed/crash-looping/unhealthy replica's report and open or fold an
    incident, keyed by deployment + top category. With no rule matched the incident is still
    opened (category engine-crash, titled from the report's reason). Never raises."""
    try:
        # the supervisor's own reason counts too; evidence line numbers are of this text
        # masked first (the incident's title, diagnoses and evidence are shown to viewers)
        lines = shown_lines([*(report.reason or "").splitlines(), *(report.log_tail or [])])
        text = "\n".join(lines)
        found = [
            d.as_dict() for d in diagnose(text, exit_code=report.exit_code, signal=report.signal)
        ]
        top = found[0] if found else None
        category = top["category"] if top else ENGINE_CRASH
        node, member = _failing_member(replica, report)
        fields = {
            "category": category,
            "severity": top["severity"] if top else Severity.CRITICAL,
            "title": (top["title"] if top else mask_secrets(report.reason or "engine failed"))[
                :300
            ],
            "replica": replica,
            "node": node,
            "subject": f"{replica.deployment.name} replica {replica.index}"
            + member
            + (f" on {node.name}" if node else ""),
            "diagnoses": found,
            "evidence": evidence_context(lines, found),
            "telemetry": telemetry_snapshot(node),
        }
    except Exception:  # noqa: BLE001
        log.exception("could not diagnose replica %s", getattr(replica, "pk", None))
        return None
    fingerprint = f"deployment:{replica.deployment_id}:{category}"
    incident = _record_open(fingerprint, fields, note="" if found else "no rule matched")
    # a multi-host member's agent gives up at once by design (the console restarts the group)
    if incident is not None and report.phase == "crash-loop" and not member:
        _note_crash_loop(incident, mask_secrets(report.reason or ""))
    return incident


def _failing_member(replica, report) -> tuple:
    """(node, words) of where a failure came from: the replica's node, or for a replica over
    several hosts the reporting member's — its rank and NPUs — so an HCCL or DP-handshake
    failure names the host it happened on (its log: run `…-rank<m>` on the replica's log
    page)."""
    if replica.deployment.nodes_per_replica <= 1 or not report.node:
        return replica.node, ""
    member = replica.members.select_related("node").filter(node__name=report.node).first()
    if member is None:
        return replica.node, ""
    npus = sorted(
        replica.allocations.filter(accelerator__node=member.node).values_list(
            "accelerator__npu_id", flat=True
        )
    )
    held = f", NPUs {','.join(map(str, npus))}" if npus else ""
    return member.node, f" rank {member.rank} of {replica.deployment.nodes_per_replica}{held}"


def _note_crash_loop(incident: Incident, reason: str) -> None:
    """The supervisor gave up restarting: say so on the incident (a note, severity critical),
    whichever crash opened it. Never raises."""
    try:
        with transaction.atomic():
            IncidentNote.objects.create(
                incident=incident,
                author="system",
                text=f"crash-loop: the agent stopped restarting the engine. {reason}"[
                    :MAX_NOTE_CHARS
                ],
            )
            Incident.objects.filter(pk=incident.pk).update(severity=Severity.CRITICAL)
    except Exception:  # noqa: BLE001 - as every opener: never break a report
        log.exception("could not note the crash-loop on incident %s", incident.pk)


def _chip_problems(chip: dict) -> list[str]:
    out = []
    if (chip.get("health") or "UNKNOWN") != "OK":
        out.append(NPU_HEALTH)
    temp = chip.get("temperature_c")
    if temp is not None and temp >= HOT_C:
        out.append(OVER_TEMPERATURE)
    return out


def _chip_fields(node, chip: dict, kind: str, accelerator) -> dict:
    health = chip.get("health") or "UNKNOWN"
    numbers = {
        k: v
        for k, v in chip.items()
        if isinstance(v, int | float) and k not in {"npu_id", "chip_id"}
    }
    if kind == NPU_HEALTH:
        found = [d.as_dict() for d in diagnose("", health=health)]
        severity = Severity.CRITICAL if health in {"Alarm", "Critical"} else Severity.WARNING
        title = f"NPU health {health}"
    else:
        found = [d.as_dict() for d in diagnose("", telemetry=numbers)]
        severity = Severity.CRITICAL
        title = f"NPU over temperature ({chip.get('temperature_c'):g} °C)"
    label = f"NPU {chip.get('npu_id')}.{chip.get('chip_id', 0)}"
    return {
        "category": kind,
        "severity": severity,
        "title": f"{title} on {node.name} {label}"[:300],
        "node": node,
        "accelerator": accelerator,
        "subject": f"{node.name} {label}",
        "diagnoses": found,
        "evidence": [],
        "telemetry": telemetry_snapshot(node) or {"received_at": None, "chips": [chip]},
    }


def open_incident_for_chip(node, chip: dict, *, kinds: list[str] | None = None) -> list[Incident]:
    """Open or fold incidents for a chip whose health is not OK (npu-health) or whose
    temperature is ≥ 85 °C (over-temperature); `kinds` narrows which. Never raises."""
    from console.inventory.models import Accelerator

    opened = []
    try:
        accelerator = Accelerator.objects.filter(
            node=node, npu_id=chip.get("npu_id"), chip_id=chip.get("chip_id", 0)
        ).first()
        for kind in _chip_problems(chip):
            if kinds is not None and kind not in kinds:
                continue
            key = f"{chip.get('npu_id')}.{chip.get('chip_id', 0)}"
            fields = _chip_fields(node, chip, kind, accelerator)
            incident = _record_open(f"npu:{node.name}:{key}:{kind}", fields)
            if incident is not None:
                opened.append(incident)
    except Exception:  # noqa: BLE001
        log.exception("could not open chip incident on %s", getattr(node, "name", node))
    return opened


def chips_reported(node_id: int, chips: list[dict]) -> None:
    """Heartbeat hook, called before the chips are stored: opens an incident for each chip
    whose health changed to a not-OK value, and for each hot chip without an unresolved
    over-temperature incident (so a chip that stays hot does not fold on every beat)."""
    from console.inventory.models import Accelerator, Node

    try:
        before = dict(
            ((a, c), h)
            for a, c, h in Accelerator.objects.filter(node_id=node_id).values_list(
                "npu_id", "chip_id", "health"
            )
        )
        node = None
        for chip in chips:
            kinds = []
            health = chip.get("health") or "UNKNOWN"
            if health != "OK" and before.get((chip["npu_id"], chip.get("chip_id", 0))) != health:
                kinds.append(NPU_HEALTH)
            if OVER_TEMPERATURE in _chip_problems(chip):
                node = node or Node.objects.get(pk=node_id)
                key = (
                    f"npu:{node.name}:{chip['npu_id']}.{chip.get('chip_id', 0)}:{OVER_TEMPERATURE}"
                )
                if not Incident.objects.filter(fingerprint=key).exclude(status="resolved").exists():
                    kinds.append(OVER_TEMPERATURE)
            if kinds:
                node = node or Node.objects.get(pk=node_id)
                open_incident_for_chip(node, chip, kinds=kinds)
    except Exception:  # noqa: BLE001
        log.exception("chip incident hook failed for node %s", node_id)


# --- reading --------------------------------------------------------------------------------
def incident_queue(*, status: str = "", category: str = "") -> QuerySet[Incident]:
    """Unresolved first (open, then acknowledged), then critical > warning > info, then the
    most recently seen."""
    qs = Incident.objects.select_related("node", "replica__deployment", "accelerator")
    if status:
        qs = qs.filter(status=status)
    if category:
        qs = qs.filter(category=category)
    status_rank = Case(
        When(status=IncidentStatus.OPEN, then=Value(0)),
        When(status=IncidentStatus.ACKNOWLEDGED, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    severity_rank = Case(
        When(severity=Severity.CRITICAL, then=Value(0)),
        When(severity=Severity.WARNING, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    return qs.annotate(status_rank=status_rank, severity_rank_db=severity_rank).order_by(
        "status_rank", "severity_rank_db", "-last_seen", "-id"
    )


def get_incident(incident_id: int) -> Incident:
    try:
        return Incident.objects.select_related("node", "replica__deployment", "accelerator").get(
            pk=incident_id
        )
    except Incident.DoesNotExist:
        raise NotFound(f"incident {incident_id} not found", field="id") from None


# --- actions --------------------------------------------------------------------------------
def _transition(
    *, actor: Actor, incident_id: int, to: str, allowed: list[str], **fields
) -> Incident:
    check_role(actor, Role.OPERATOR)
    with transaction.atomic():
        updated = Incident.objects.filter(pk=incident_id, status__in=allowed).update(
            status=to, **fields
        )
        incident = get_incident(incident_id)
        if not updated:
            raise Conflict(f"incident #{incident_id} is {incident.status}", field="status")
        action = {"acknowledged": "incident.acknowledge", "resolved": "incident.resolve"}[to]
        record(actor=actor, action=action, obj=incident, after={"status": to})
        if to == IncidentStatus.RESOLVED:
            webhooks.dispatch(incident.pk, "resolved")
    return incident


def acknowledge_incident(
    *, actor: Actor, incident_id: int, now: datetime | None = None
) -> Incident:
    """open → acknowledged (409 otherwise). Operator role; audited."""
    return _transition(
        actor=actor,
        incident_id=incident_id,
        to=IncidentStatus.ACKNOWLEDGED,
        allowed=[IncidentStatus.OPEN],
        acknowledged_by=actor.name[:150],
        acknowledged_at=now or timezone.now(),
    )


def resolve_incident(*, actor: Actor, incident_id: int, now: datetime | None = None) -> Incident:
    """open/acknowledged → resolved (409 otherwise). A recurrence opens a new incident."""
    return _transition(
        actor=actor,
        incident_id=incident_id,
        to=IncidentStatus.RESOLVED,
        allowed=[IncidentStatus.OPEN, IncidentStatus.ACKNOWLEDGED],
        resolved_by=actor.name[:150],
        resolved_at=now or timezone.now(),
    )


def add_incident_note(*, actor: Actor, incident_id: int, text: str) -> IncidentNote:
    """Append a note (any status). Operator role; audited; 422 on empty or > 5000 chars."""
    check_role(actor, Role.OPERATOR)
    text = (text or "").strip()
    if not text:
        raise Invalid("text: a note cannot be empty", field="text")
    if len(text) > MAX_NOTE_CHARS:
        raise Invalid(f"text: at most {MAX_NOTE_CHARS} characters", field="text")
    with transaction.atomic():
        incident = get_incident(incident_id)
        note = IncidentNote.objects.create(
            incident=incident, author=actor.name[:150], user=actor.user, text=text
        )
        record(actor=actor, action="incident.note", obj=incident, message=text[:500])
    return note


# --- metrics --------------------------------------------------------------------------------
def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def incident_metrics_lines() -> list[str]:
    """Prometheus text lines: gauge npu_console_incidents{category,severity,status}."""
    rows = (
        Incident.objects.values("category", "severity", "status")
        .annotate(n=Count("id"))
        .order_by("category", "severity", "status")
    )
    lines = [
        "# HELP npu_console_incidents Incidents by category, severity and status.",
        "# TYPE npu_console_incidents gauge",
    ]
    for row in rows:
        labels = ",".join(f'{k}="{_label(row[k])}"' for k in ("category", "severity", "status"))
        lines.append(f"npu_console_incidents{{{labels}}} {row['n']}")
    return lines


# --- NPU journal ----------------------------------------------------------------------------
def add_accelerator_note(*, actor: Actor, accelerator_id: int, text: str):
    """Append a free-text note to an NPU's journal: an audit entry "accelerator.note"."""
    from console.inventory.models import Accelerator

    check_role(actor, Role.OPERATOR)
    text = (text or "").strip()
    if not text:
        raise Invalid("text: a note cannot be empty", field="text")
    if len(text) > 500:
        raise Invalid("text: at most 500 characters", field="text")
    accelerator = Accelerator.objects.filter(pk=accelerator_id).first()
    if accelerator is None:
        raise NotFound(f"accelerator {accelerator_id} not found", field="id")
    return record(actor=actor, action="accelerator.note", obj=accelerator, message=text)
