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
from django.db.models import Case, Count, F, IntegerField, Q, QuerySet, Value, When
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.deployments.masking import shown_lines
from console.diagnosis import webhooks
from console.diagnosis.matcher import diagnose
from console.diagnosis.models import Incident, IncidentNote, IncidentStatus, NoteKind, Severity
from console.errors import Conflict, Invalid, NotFound
from workers.engine.shipper import mask_secrets

log = logging.getLogger(__name__)

CONTEXT_LINES = 3
MAX_NOTE_CHARS = 5000
HOT_C = 85.0  # as console.inventory.live.HOT_C
ENGINE_CRASH = "engine-crash"
NPU_HEALTH = "npu-health"
OVER_TEMPERATURE = "over-temperature"
# a crash-looping replica folds many times: the first repeats each get a timeline entry, the
# rest only move `count` and `last_seen` (the page says how many it does not list)
MAX_REPEAT_NOTES = 50
CRASH_LOOP_NOTE = "crash-loop: the agent stopped restarting the engine. {}"


# --- opening and folding ------------------------------------------------------------------
def _open_or_fold(
    *, fingerprint: str, fields: dict, note: str = "", repeat: str = "", always: bool = False
) -> tuple[Incident, str]:
    """Fold into the unresolved incident with this fingerprint (one conditional UPDATE), or
    open a new one. Returns (incident, "opened" | "folded"). Safe under concurrency: the
    partial unique constraint lets only one opener win; the loser folds. A fold writes a
    `repeat` timeline entry saying `repeat` (the first MAX_REPEAT_NOTES of them; `always`:
    past those too)."""
    now = timezone.now()
    unresolved = Incident.objects.filter(fingerprint=fingerprint).exclude(
        status=IncidentStatus.RESOLVED
    )
    for _ in range(3):
        if unresolved.update(count=F("count") + 1, last_seen=now):
            incident = unresolved.get()
            _folded(incident, fields, repeat, now, always=always)
            return incident, "folded"
        try:
            with transaction.atomic():
                incident = Incident.objects.create(
                    fingerprint=fingerprint, first_seen=now, last_seen=now, **fields
                )
                if note:
                    IncidentNote.objects.create(
                        incident=incident, author="system", kind=NoteKind.SYSTEM, text=note, at=now
                    )
            return incident, "opened"
        except IntegrityError:
            continue  # someone else opened it meanwhile: fold into theirs
    raise Conflict(f"could not open or fold incident {fingerprint}")


def _evidence_lines(evidence: list[dict]) -> int:
    return sum(len(block.get("context") or []) for block in evidence or [])


def _folded(
    incident: Incident, fields: dict, repeat: str, now: datetime, *, always: bool = False
) -> None:
    """A repeat's traces: its timeline entry, and — while no rule matched either time — its
    log lines as the evidence when they are more than the incident holds (an engine first seen
    unhealthy, reason only, then dying with its log tail: on-call reads the tail)."""
    if repeat and (always or incident.count - 1 <= MAX_REPEAT_NOTES):
        text = f"seen again ({incident.count} times): {repeat}"[:MAX_NOTE_CHARS]
        IncidentNote.objects.create(
            incident=incident, author="system", kind=NoteKind.REPEAT, text=text, at=now
        )
    evidence = fields.get("evidence") or []
    if (
        not incident.diagnoses
        and not fields.get("diagnoses")
        and _evidence_lines(evidence) > _evidence_lines(incident.evidence)
    ):
        Incident.objects.filter(pk=incident.pk).update(evidence=evidence)
        incident.evidence = evidence


def _record_open(
    fingerprint: str, fields: dict, note: str = "", repeat: str = "", always: bool = False
) -> Incident | None:
    """Open or fold and announce it; logs and returns None on any failure."""
    try:
        with transaction.atomic():
            incident, event = _open_or_fold(
                fingerprint=fingerprint, fields=fields, note=note, repeat=repeat, always=always
            )
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


def replica_fingerprint(replica, category: str, member_node=None) -> str:
    """What folds: the same replica (and, over several hosts, the same failing member's node)
    failing the same way. Five replicas of one deployment failing are five incidents."""
    where = f":node:{member_node.name}" if member_node is not None else ""
    return f"deployment:{replica.deployment_id}:replica:{replica.pk}{where}:{category}"


def open_incident_for_replica(replica, report) -> Incident | None:
    """Diagnose a failed/crash-looping/unhealthy replica's report and open or fold an
    incident, keyed by replica (+ the failing member's node over several hosts) + top
    category; a repeat folds (count, last seen, a timeline entry). With no rule matched the
    incident is still opened (category engine-crash, titled from the report's reason) and
    shows the lines it was opened from. The NPUs the replica held are linked (the NPU
    journal lists the incident). Never raises."""
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
        node, member, npus = _failing_member(replica, report)
        held = _npu_words(npus) if not member else ""
        fields = {
            "category": category,
            "severity": top["severity"] if top else Severity.CRITICAL,
            "title": (top["title"] if top else mask_secrets(report.reason or "engine failed"))[
                :300
            ],
            "replica": replica,
            "node": node,
            "subject": (
                f"{replica.deployment.name} replica {replica.index}{member}"
                + (f" on {node.name}" if node else "")
                + held
            )[:200],
            "diagnoses": found,
            "evidence": evidence_context(lines, found),
            "telemetry": telemetry_snapshot(node),
        }
    except Exception:  # noqa: BLE001
        log.exception("could not diagnose replica %s", getattr(replica, "pk", None))
        return None
    fingerprint = replica_fingerprint(replica, category, node if member else None)
    reason = mask_secrets(report.reason or "")
    # a multi-host member's agent gives up at once by design (the console restarts the group)
    gave_up = report.phase == "crash-loop" and not member
    incident = _record_open(
        fingerprint,
        fields,
        note="" if found else "no rule matched",
        repeat=CRASH_LOOP_NOTE.format(reason) if gave_up else f"{report.phase}: {reason}",
        always=gave_up,
    )
    if incident is not None and npus:
        _link_npus(incident, npus)
    if incident is not None and gave_up:
        _note_crash_loop(incident, reason)
    return incident


ROLLOUT_FAILED = "rollout-failed"


def open_incident_for_rollout(deployment, rollout, replica, why: str) -> Incident | None:
    """A rolling update's new generation failed and was rolled back (or the rollback failed:
    critical): one incident per deployment and rollout, a repeat folds. Never raises."""
    rolled_back = rollout.state == "rolling-back"
    fields = {
        "category": ROLLOUT_FAILED,
        "severity": Severity.WARNING if rolled_back else Severity.CRITICAL,
        "title": (
            f"rolling update of {deployment.name} to spec v{rollout.to_version} "
            + (f"rolled back to v{rollout.from_version}" if rolled_back else "failed")
        )[:300],
        "replica": replica,
        "node": replica.node if replica is not None else None,
        "subject": f"{deployment.name} replica {getattr(replica, 'index', '?')}"[:200],
    }
    incident = _record_open(
        f"deployment:{deployment.pk}:rollout:{rollout.pk}",
        fields,
        note=mask_secrets(why)[:MAX_NOTE_CHARS],
        repeat=mask_secrets(why),
    )
    if incident is not None and not rolled_back:  # a rollback that failed folds in: worse now
        try:
            Incident.objects.filter(pk=incident.pk).update(
                severity=Severity.CRITICAL, title=fields["title"]
            )
        except Exception:  # noqa: BLE001 - as every opener: never break the caller
            log.exception("could not raise the severity of incident %s", incident.pk)
    return incident


def _held_npus(replica, node) -> list:
    """The Accelerator rows the replica holds on `node` (all of its own when None)."""
    from console.inventory.models import Accelerator

    held = Accelerator.objects.filter(allocation__replica=replica)
    if node is not None:
        held = held.filter(node=node)
    return list(held.order_by("npu_id", "chip_id"))


def _failing_member(replica, report) -> tuple:
    """(node, words, NPUs) of where a failure came from: the replica's node and NPUs, or for
    a replica over several hosts the reporting member's — its rank and NPUs — so an HCCL or
    DP-handshake failure names the host it happened on (its log: run `…-rank<m>` on the
    replica's log page)."""
    if replica.deployment.nodes_per_replica <= 1 or not report.node:
        return replica.node, "", _held_npus(replica, None)
    member = replica.members.select_related("node").filter(node__name=report.node).first()
    if member is None:
        return replica.node, "", _held_npus(replica, None)
    npus = _held_npus(replica, member.node)
    words = f" rank {member.rank} of {replica.deployment.nodes_per_replica}{_npu_words(npus)}"
    return member.node, words, npus


def _npu_words(npus: list) -> str:
    """ ", NPU 3" / ", NPUs 0,1" / "" — the NPU ids a failing engine held."""
    ids = sorted({a.npu_id for a in npus})
    return f", NPU{'s' if len(ids) > 1 else ''} {','.join(map(str, ids))}" if ids else ""


def _link_npus(incident: Incident, npus: list) -> None:
    """Remember the NPUs the failing engine held (kept after they are released). Never
    raises."""
    try:
        incident.accelerators.add(*npus)
    except Exception:  # noqa: BLE001 - as every opener: never break a report
        log.exception("could not link the NPUs of incident %s", incident.pk)


def _note_crash_loop(incident: Incident, reason: str) -> None:
    """The supervisor gave up restarting: say so on the incident (severity critical), whichever
    crash opened it. A fold said it in its repeat entry already; an incident this report opened
    gets a system note. Never raises."""
    try:
        with transaction.atomic():
            if incident.count == 1:
                IncidentNote.objects.create(
                    incident=incident,
                    author="system",
                    kind=NoteKind.SYSTEM,
                    text=CRASH_LOOP_NOTE.format(reason)[:MAX_NOTE_CHARS],
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


def incidents_of_accelerator(accelerator) -> QuerySet[Incident]:
    """Every incident about one NPU, newest first: its own faults (health, temperature — also
    those opened on the node's first beat, before the chip had a row: matched by the chip's
    fingerprint) and the failures of engines that held it."""
    chip = f"npu:{accelerator.node.name}:{accelerator.npu_id}.{accelerator.chip_id}:"
    mine = (
        Q(accelerator=accelerator)
        | Q(accelerators=accelerator)
        | Q(node_id=accelerator.node_id, fingerprint__startswith=chip)
    )
    ids = Incident.objects.filter(mine).values("pk")
    return Incident.objects.filter(pk__in=ids).order_by("-last_seen", "-id")


def timeline(incident: Incident) -> dict:
    """The incident's timeline in order (opened, then its notes, actions and folded repeats),
    and how many repeats were folded without an entry of their own."""
    notes = list(incident.notes.all())
    listed = sum(1 for n in notes if n.kind == NoteKind.REPEAT)
    return {"entries": notes, "unlisted_repeats": max(0, incident.count - 1 - listed)}


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
        IncidentNote.objects.create(
            incident=incident,
            author=actor.name[:150],
            user=actor.user,
            kind=NoteKind.ACTION,
            text=str(to),
        )
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
