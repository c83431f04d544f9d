"""Incident pages (queue, detail, actions), the node doctor and the per-NPU journal.

Viewers read; actions are POST forms needing the operator role, each a thin adapter over
console.diagnosis.incidents.
"""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from console.accounts.decorators import role_required
from console.accounts.models import AuditEntry
from console.accounts.services import actor_from_request
from console.diagnosis import incidents
from console.diagnosis.models import Incident, IncidentStatus
from console.errors import DomainError
from console.inventory.models import Accelerator, CheckRunStatus, Node
from console.pagination import page_of


def _run(request, fn, ok_message: str, **kwargs) -> None:
    try:
        fn(actor=actor_from_request(request), **kwargs)
        messages.success(request, ok_message)
    except DomainError as exc:
        messages.error(request, exc.message)


@role_required("viewer")
def incident_list(request):
    status = request.GET.get("status", "")
    category = request.GET.get("category", "")
    queue = incidents.incident_queue(status=status, category=category)
    # the queue shows these columns only: no joins, no JSON (diagnoses, evidence) to decode;
    # as dicts, which the template engine reads faster than model attributes
    fields = ("pk", "status", "severity", "category", "title", "subject", "count", "last_seen")
    page = page_of(request, queue.select_related(None).values(*fields))
    context = {
        "incidents": page,
        "page": page,
        "status": status,
        "category": category,
        "statuses": IncidentStatus.choices,
        "categories": Incident.objects.order_by("category")
        .values_list("category", flat=True)
        .distinct(),
    }
    return render(request, "diagnosis/incidents.html", context)


@role_required("viewer")
def incident_detail(request, incident_id: int):
    incident = get_object_or_404(
        Incident.objects.select_related("node", "replica__deployment", "accelerator"),
        pk=incident_id,
    )
    context = {
        "incident": incident,
        "timeline": incidents.timeline(incident),
        "npus": incident.accelerators.select_related("node").order_by("node__name", "npu_id"),
        "member_logs": _member_logs(incident.replica),
    }
    return render(request, "diagnosis/incident.html", context)


def _member_logs(replica) -> list[tuple]:
    """For a replica over several hosts: each member with the newest run of its log
    (`gen<g>-run<n>[-rank<m>]`, console/logs), so on-call reads every host's side."""
    if replica is None or replica.deployment.nodes_per_replica <= 1:
        return []
    from console.logs.services import parse_run, runs_of

    runs = runs_of(replica=replica)
    newest = {}
    for key in runs:  # newest first
        newest.setdefault(parse_run(key, runs).member, key)
    members = replica.members.select_related("node").order_by("rank")
    return [(m, newest.get(m.rank)) for m in members]


def _back(request, incident_id: int):
    if request.POST.get("next") == "list":
        return redirect("incident-list")
    return redirect("incident-detail", incident_id=incident_id)


@require_POST
@role_required("operator")
def incident_ack(request, incident_id: int):
    _run(
        request,
        incidents.acknowledge_incident,
        f"#{incident_id} acknowledged",
        incident_id=incident_id,
    )
    return _back(request, incident_id)


@require_POST
@role_required("operator")
def incident_resolve(request, incident_id: int):
    _run(request, incidents.resolve_incident, f"#{incident_id} resolved", incident_id=incident_id)
    return _back(request, incident_id)


@require_POST
@role_required("operator")
def incident_note(request, incident_id: int):
    _run(
        request,
        incidents.add_incident_note,
        "note added",
        incident_id=incident_id,
        text=request.POST.get("text", ""),
    )
    return _back(request, incident_id)


@role_required("viewer")
def node_doctor(request, name: str):
    """The node's latest check run, each check pass/fail with evidence and fix; the `run`
    partial polls while the run is pending."""
    node = get_object_or_404(Node, name=name)
    run = node.check_runs.first()
    context = {
        "node": node,
        "run": run,
        "pending": run is not None and run.status == CheckRunStatus.PENDING,
        "incidents": Incident.objects.filter(node=node).exclude(status=IncidentStatus.RESOLVED)[
            :20
        ],
    }
    template = "diagnosis/incident_doctor.html"
    return render(request, f"{template}#run" if request.htmx else template, context)


@role_required("viewer")
def accelerator_journal(request, accelerator_id: int):
    accelerator = get_object_or_404(Accelerator.objects.select_related("node"), pk=accelerator_id)
    context = {
        "accelerator": accelerator,
        "entries": AuditEntry.objects.filter(
            object_type="inventory.accelerator", object_id=str(accelerator.pk)
        )[:200],
        "incidents": incidents.incidents_of_accelerator(accelerator)[:100],
    }
    return render(request, "diagnosis/incident_journal.html", context)


@require_POST
@role_required("operator")
def accelerator_note(request, accelerator_id: int):
    _run(
        request,
        incidents.add_accelerator_note,
        "note added to the journal",
        accelerator_id=accelerator_id,
        text=request.POST.get("text", ""),
    )
    return redirect("accelerator-journal", accelerator_id=accelerator_id)
