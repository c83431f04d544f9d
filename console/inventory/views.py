"""Inventory pages: dashboard, node list, node detail and their htmx actions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import redis
from django.contrib import messages
from django.db.models import Count, Value
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from console.accounts.decorators import role_required
from console.accounts.models import AuditEntry
from console.accounts.services import actor_from_request, has_role
from console.deployments.models import NpuAllocation, ReplicaMember
from console.errors import DomainError, Invalid
from console.inventory import checks, enrollment, identity, live, services
from console.inventory.api import NodeFilters, filter_nodes
from console.inventory.models import Accelerator, EnrollmentToken, Health, Node, NodeStatus
from console.pagination import page_of
from console.telemetry import services as telemetry


def fleet_counts() -> dict:
    """Fleet totals for the dashboard: one query of two GROUP BYs over covering indexes (node
    status and simulated; NPU health and isolated), whatever the fleet's size. Filtered COUNTs
    over every row were 3x slower on a 1,000-node fleet, two queries ~0.3 ms slower on
    PostgreSQL."""
    nodes = {"total": 0, "simulated": 0} | {s.value: 0 for s in NodeStatus}
    npus = {"total": 0, "healthy": 0, "unhealthy": 0, "unknown": 0, "isolated": 0}
    by_node = Node.objects.annotate(kind=Value(0)).values_list("kind", "status", "simulated")
    by_npu = Accelerator.objects.annotate(kind=Value(1)).values_list("kind", "health", "isolated")
    rows = (
        by_node.annotate(n=Count("id"))
        .order_by()
        .union(by_npu.annotate(n=Count("id")).order_by(), all=True)
    )
    for kind, state, flag, n in rows:
        if kind == 0:
            nodes["total"] += n
            nodes[state] = nodes.get(state, 0) + n
            nodes["simulated"] += n if flag else 0
        else:
            npus["total"] += n
            npus[{Health.OK: "healthy", Health.UNKNOWN: "unknown"}.get(state, "unhealthy")] += n
            npus["isolated"] += n if flag else 0
    return {"nodes": nodes, "npus": npus}


def _hot(fn, arg, *, default):
    """Live values from Redis; when Redis is down the page still renders and says so."""
    try:
        return fn(arg), None
    except redis.RedisError as exc:
        return default, f"live telemetry unavailable: cannot reach Redis ({exc.__class__.__name__})"


@role_required("viewer")
def dashboard(request):
    metric = request.GET.get("metric", "aicore")
    metric = metric if metric in live.METRICS else "aicore"
    # The heatmap shows one page of nodes; the live totals cover the fleet from the running
    # sums the beats keep in Redis (telemetry.fleet_totals), not from every node's latest beat.
    counts = fleet_counts()
    rows = Node.objects.values("name", "status", "simulated").order_by("name")
    page = page_of(request, rows, count=counts["nodes"]["total"])
    latest, hot_error = _hot(telemetry.latest_many, [n["name"] for n in page], default={})
    sums, _ = _hot(lambda _: telemetry.fleet_totals(), None, default=[0, 0, 0, 0.0, 0, 0])
    context = {
        "counts": counts,
        "totals": live.totals_of(sums),
        "heatmap": live.heatmap(page, latest, metric),
        "page": page,
        "metric": metric,
        "metrics": live.METRICS,
        "hot_error": hot_error,
        "recent": AuditEntry.objects.all()[:10],
    }
    template = "inventory/dashboard.html#live" if request.htmx else "inventory/dashboard.html"
    return render(request, template, context)


NODE_LIST_FIELDS = (
    "name",
    "status",
    "simulated",
    "telemetry_ok",
    "telemetry_reason",
    "log_error",
    "agent_version",
    "arch",
    "cpu_model",
    "npu_driver_version",
    "cann_version",
    "labels",
    "last_heartbeat",
)


@role_required("viewer")
def node_list(request):
    filters = (
        NodeFilters(
            status=request.GET.get("status") or None,
            q=request.GET.get("q") or None,
            label=request.GET.get("label") or None,
        )
        if request.GET.get("status", "") in {"", *NodeStatus.values}
        else NodeFilters()
    )
    # Rows as dicts of the shown columns: the template engine reads a dict key at once, a
    # model attribute only after a failed subscript (docs/scale.md)
    rows = filter_nodes(Node.objects.all(), filters).values("id", *NODE_LIST_FIELDS)
    page = page_of(request, rows.order_by("name"))
    # NPUs counted for this page's nodes only (a GROUP BY over the fleet's NPUs costs more)
    counts = dict(
        Accelerator.objects.filter(node__in=[n["id"] for n in page])
        .values_list("node_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    for node in page:
        node["npu_count"] = counts.get(node["id"], 0)
    context = {"nodes": page, "page": page, "filters": filters, "statuses": NodeStatus.choices}
    template = "inventory/nodes.html#rows" if request.htmx else "inventory/nodes.html"
    return render(request, template, context)


@dataclass(frozen=True)
class Holder:
    """The replica holding an NPU, as the node page links it."""

    deployment: str
    replica_id: int
    index: int
    state: str
    rank: int | None  # a multi-host replica's member on this node (0: the leader); else None


def npu_holders(node: Node) -> dict[tuple[int, int], Holder]:
    """(npu_id, chip_id) -> the replica holding that chip of `node`. Two queries whatever
    the number of NPUs: the allocations with their replica and deployment, and this node's
    members of multi-host replicas."""
    rows = list(
        NpuAllocation.objects.filter(accelerator__node=node).values_list(
            "accelerator__npu_id",
            "accelerator__chip_id",
            "replica_id",
            "replica__index",
            "replica__state",
            "replica__deployment__name",
        )
    )
    ranks = (
        dict(
            ReplicaMember.objects.filter(
                node=node, replica_id__in={r[2] for r in rows}
            ).values_list("replica_id", "rank")
        )
        if rows
        else {}
    )
    return {
        (npu, chip): Holder(dep, rid, index, state, ranks.get(rid))
        for npu, chip, rid, index, state, dep in rows
    }


@role_required("viewer")
def node_detail(request, name: str):
    node = get_object_or_404(Node, name=name)
    data, hot_error = _hot(telemetry.latest, node.name, default=None)
    holders = npu_holders(node)
    npus = live.npu_rows(data)
    accelerators = list(node.accelerators.all())
    for row in [*npus, *accelerators]:
        row.holder = holders.get((row.npu_id, row.chip_id))
    context = {
        "node": node,
        "latest": data,
        "hot_error": hot_error,
        "npus": npus,
        "hugepages": any(n.hugepages_total is not None for n in npus),
        "charts": live.node_charts(node.pk),
        "check_run": node.check_runs.first(),
        "accelerators": accelerators,
        "events": AuditEntry.objects.filter(object_type="inventory.node", object_id=str(node.pk))[
            :20
        ],
        # admins only: a credential's history is of no use to anyone who cannot act on it
        "credentials": (
            identity.credentials_of(node)
            if has_role(request.user, "admin") and not request.htmx
            else None
        ),
    }
    template = "inventory/node_detail.html#live" if request.htmx else "inventory/node_detail.html"
    return render(request, template, context)


def _run(request, fn, ok_message: str, **kwargs) -> None:
    try:
        fn(actor=actor_from_request(request), **kwargs)
        messages.success(request, ok_message)
    except DomainError as exc:
        messages.error(request, exc.message)


@require_POST
@role_required("operator")
def node_state(request, name: str):
    action = request.POST.get("action", "")
    _run(
        request,
        services.set_node_state,
        f"{name}: {action} done",
        name=name,
        action=action,
        reason=request.POST.get("reason", ""),
    )
    return redirect("node-detail", name=name)


@require_POST
@role_required("operator")
def node_labels(request, name: str):
    labels = {}
    for line in request.POST.get("labels", "").splitlines():
        if line.strip():
            key, _, value = line.partition("=")
            labels[key.strip()] = value.strip()
    _run(request, services.set_node_labels, "labels saved", name=name, labels=labels)
    return redirect("node-detail", name=name)


@require_POST
@role_required("admin")
def node_address_accept(request, name: str):
    _run(request, services.accept_node_address, f"{name}: new address accepted", name=name)
    return redirect("node-detail", name=name)


@require_POST
@role_required("admin")
def node_credential_rotate(request, name: str):
    _run(
        request,
        identity.rotate_credential,
        f"{name}: new credential issued; the old one stays valid until the agent switches",
        name=name,
    )
    return redirect("node-detail", name=name)


@require_POST
@role_required("admin")
def node_credential_revoke(request, name: str):
    reason = request.POST.get("reason", "").strip()
    _run(
        request,
        identity.revoke_credential,
        f"{name}: credentials revoked; the node is cut off",
        name=name,
        reason=reason,
    )
    return redirect("node-detail", name=name)


@require_POST
@role_required("admin")
def node_reenroll(request, name: str):
    _run(
        request,
        identity.allow_reenrollment,
        f"{name}: may enroll once more with a valid enrollment token",
        name=name,
    )
    return redirect("node-detail", name=name)


@require_POST
@role_required("operator")
def accelerator_isolation(request, accelerator_id: int):
    acc = get_object_or_404(Accelerator.objects.select_related("node"), pk=accelerator_id)
    isolate = request.POST.get("isolate") == "1"
    _run(
        request,
        services.set_isolation,
        f"{acc}: {'isolated' if isolate else 'released'}",
        accelerator_id=acc.pk,
        isolated=isolate,
        reason=request.POST.get("reason", ""),
    )
    return redirect("node-detail", name=acc.node.name)


@role_required("admin")
def enrollment_tokens(request):
    created = request.session.pop("new_enrollment", None)
    context = {
        "tokens": EnrollmentToken.objects.annotate(node_count=Count("nodes")),
        "created": created,
        "now": timezone.now(),
    }
    return render(request, "inventory/enrollment.html", context)


@require_POST
@role_required("admin")
def enrollment_create(request):
    try:
        token, raw = enrollment.create_enrollment_token(
            actor=actor_from_request(request),
            name=request.POST.get("name", ""),
            expires_at=_expiry(request.POST.get("expires_in_h", "")),
            max_uses=_max_uses(request.POST),
            node_pattern=request.POST.get("node_pattern", ""),
        )
        request.session["new_enrollment"] = {"name": token.name, "value": raw}
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("enrollment")


def _expiry(hours: str):
    """The form's "expires in" (hours; empty = never) as a time, or Invalid."""
    if not hours.strip():
        return None
    try:
        value = float(hours)
    except ValueError:
        raise Invalid("expires in: a number of hours", field="expires_at") from None
    if not 0 < value <= 24 * 366:
        raise Invalid("expires in: between a minute and a year, in hours", field="expires_at")
    return timezone.now() + timedelta(hours=value)


def _max_uses(form) -> int | None:
    """1 when "single use" is ticked, else the "max uses" number (empty = unlimited)."""
    if form.get("single_use"):
        return 1
    raw = form.get("max_uses", "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise Invalid("max uses: a whole number, 1 or more", field="max_uses") from None


@require_POST
@role_required("admin")
def enrollment_revoke(request, token_id: int):
    _run(request, enrollment.revoke_enrollment_token, "enrollment token revoked", token_id=token_id)
    return redirect("enrollment")


@require_POST
@role_required("operator")
def node_checks(request, name: str):
    _run(
        request,
        checks.request_checks,
        "checks requested; results appear below within seconds",
        name=name,
    )
    return redirect("node-detail", name=name)
