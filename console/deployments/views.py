"""Deployment pages: list, create/edit with live validation, detail with replicas and actions."""

from __future__ import annotations

import json
import time
import urllib.request

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from console.accounts.decorators import role_required
from console.accounts.services import actor_from_request
from console.deployments import autoscale, rollout, services
from console.deployments.engines import engine_charts, engine_metrics
from console.deployments.forms import engine_rows, initial_from, kept_fields, parse_form
from console.deployments.inspection import InspectionPending
from console.deployments.masking import shown_lines
from console.deployments.models import (
    Autoscaler,
    Deployment,
    NpuAllocation,
    Replica,
    ReplicaState,
    engine_api_key,
)
from console.deployments.schemas import AutoscalerIn, CanaryIn
from console.errors import DomainError
from console.inventory.models import Node
from console.pagination import page_of
from workers import engine_settings
from workers.contracts import describe

# An engine is on our own network: an HTTP_PROXY in the console's environment must not get
# the request (nor the engine key it carries).
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
LIST_FIELDS = (
    "name",
    "served_model_name",
    "model_path",
    "desired_state",
    "replicas",
    "npus_per_replica",
    "device",
    *(row.name for row in engine_settings.rows(engine_settings.LIST)),
)


@role_required("viewer")
def deployment_list(request):
    """One page of deployments as plain rows: the shown columns (a deployment's estimate and
    model info, a replica's log tail and metrics are JSON the list would decode for nothing)
    and each one's replica states in index order, in two queries. Dicts, not model instances:
    the template engine reads a dict key at once, a model attribute only after a failed
    subscript."""
    page = page_of(request, Deployment.objects.values("id", *LIST_FIELDS).order_by("name"))
    states: dict[int, list[str]] = {d["id"]: [] for d in page}
    # where each runs: node -> the NPUs its replicas hold there (a multi-host replica's
    # members each on their own node), from one more query
    placed: dict[int, dict[str, list[int]]] = {d["id"]: {} for d in page}
    replicas = Replica.objects.filter(deployment_id__in=states).order_by("deployment_id", "index")
    for deployment_id, state, node in replicas.values_list("deployment_id", "state", "node__name"):
        states[deployment_id].append(state)
        if node:
            placed[deployment_id].setdefault(node, [])
    held = NpuAllocation.objects.filter(replica__deployment_id__in=states).values_list(
        "replica__deployment_id", "accelerator__node__name", "accelerator__npu_id"
    )
    for deployment_id, node, npu in held:
        placed[deployment_id].setdefault(node, []).append(npu)
    for d in page:
        d["replica_states"] = states[d["id"]]
        d["ready_count"] = states[d["id"]].count(ReplicaState.READY)
        d["placement"] = [
            {"node": node, "npus": sorted(set(npus))}
            for node, npus in sorted(placed[d["id"]].items())
        ]
    template = "deployments/list.html#rows" if request.htmx else "deployments/list.html"
    return render(request, template, {"deployments": page, "page": page})


def _form_context(request, dep: Deployment | None = None, **extra) -> dict:
    context = {"dep": dep, "nodes": Node.objects.order_by("name"), "post": request.POST}
    context.update(extra)
    context["engine_rows"] = engine_rows(context["post"])
    error = context.get("error")
    # the field an error names, without its key ("extra_env.HF_TOKEN" -> "extra_env"): the
    # form shows the message under that field
    context["error_field"] = (getattr(error, "field", None) or "").split(".")[0]
    return context


@role_required("operator")
def deployment_new(request):
    if request.method == "POST":
        try:
            dep = services.create_deployment(
                actor=actor_from_request(request), payload=parse_form(request.POST)
            )
            messages.success(request, f"deployment {dep.name} created")
            return redirect("deployment-detail", name=dep.name)
        except DomainError as exc:
            return render(
                request, "deployments/form.html", _form_context(request, error=exc), status=422
            )
    return render(request, "deployments/form.html", _form_context(request))


@role_required("operator")
def deployment_edit(request, name: str):
    """The create form, filled from the deployment; saving goes through update_deployment (the
    API's PUT): the same checks, audit entry and reconcile. The name is the URL's; fields the
    form does not show keep their stored values; `***` where a secret was shown keeps it."""
    dep = get_object_or_404(Deployment.objects.select_related("pinned_node"), name=name)
    if request.method != "POST":
        return render(
            request, "deployments/form.html", _form_context(request, dep, post=initial_from(dep))
        )
    post = request.POST.copy()
    post["name"] = dep.name  # never renamed, whatever was posted
    try:
        payload = parse_form(post, keep=kept_fields(dep))
        dep = services.update_deployment(
            actor=actor_from_request(request), name=dep.name, payload=payload
        )
    except DomainError as exc:
        context = _form_context(request, dep, post=post, error=exc)
        return render(request, "deployments/form.html", context, status=exc.status)
    messages.success(request, f"deployment {dep.name} updated (spec v{dep.spec_version})")
    return redirect("deployment-detail", name=dep.name)


@require_POST
@role_required("operator")
def deployment_validate(request):
    """htmx: validate the form as it changes; show the memory estimate or the first problem.
    `editing`: the deployment the edit form changes (its own NPUs are no conflict)."""
    try:
        editing = request.POST.get("editing") or None
        checked = services.check_spec(
            parse_form(request.POST), deployment=editing, actor=actor_from_request(request)
        )
        context = {"estimate": checked.estimate, "info": checked.model_info}
    except InspectionPending as exc:  # the partial polls until the agent has answered
        context = {"inspecting": exc.inspection}
    except DomainError as exc:
        context = {"error": exc}
    return render(request, "deployments/form.html#check", context)


@role_required("viewer")
def deployment_detail(request, name: str):
    dep = get_object_or_404(Deployment.objects.select_related("pinned_node"), name=name)
    replicas = list(
        dep.replica_set.select_related("node").prefetch_related(
            "allocations__accelerator", "events"
        )
    )
    try:
        metrics = engine_metrics([r.pk for r in replicas])
    except Exception:  # noqa: BLE001 - Redis down: the page still renders
        metrics = {}
    many = len(replicas) > COLLAPSE_OVER
    for r in replicas:
        r.collapsed = many and r.state not in FAILING  # a long page: failing cards stay open
        r.group_members = _members(r) if dep.nodes_per_replica > 1 else []
        r.live_metrics = metrics.get(r.pk, {})
        try:
            r.charts = engine_charts(r.pk) if r.state in ("ready", "unhealthy") else []
        except Exception:  # noqa: BLE001 - Redis down: no charts, the page still renders
            r.charts = []
    context = {
        "dep": dep,
        "autoscaler": Autoscaler.objects.filter(deployment=dep).first(),
        "scaling_events": dep.scaling_events.all()[:8],
        "replicas": replicas,
        "ready": [r for r in replicas if r.state == ReplicaState.READY],
        "summary": replica_summary(replicas),
    }
    template = "deployments/detail.html#live" if request.htmx else "deployments/detail.html"
    return render(request, template, context)


# The summary's buckets: every replica state falls in one (unknown: none of these).
SUMMARY_BUCKETS = {
    "ready": (ReplicaState.READY,),
    "starting": (
        ReplicaState.PENDING,
        ReplicaState.SCHEDULED,
        ReplicaState.STARTING,
        ReplicaState.LOADING,
    ),
    "failed": (ReplicaState.FAILED, ReplicaState.CRASH_LOOP, ReplicaState.UNHEALTHY),
    "stopped": (ReplicaState.DRAINING, ReplicaState.STOPPING, ReplicaState.STOPPED),
}
FAILING = SUMMARY_BUCKETS["failed"]
COLLAPSE_OVER = 4  # more replicas than this: the cards start collapsed to one line


def replica_summary(replicas: list[Replica]) -> dict:
    """What the top of a deployment page says about its replicas (as loaded by
    deployment_detail, events and allocations prefetched: no further query): counts by
    bucket, the nodes they run on, the NPUs they hold and the latest move into a failing
    state (with the replica it happened to)."""
    counts = {b: sum(r.state in states for r in replicas) for b, states in SUMMARY_BUCKETS.items()}
    counts["unknown"] = len(replicas) - sum(counts.values())
    nodes = {r.node.name for r in replicas if r.node_id}
    nodes |= {m.node.name for r in replicas for m in getattr(r, "group_members", [])}
    # a move into a failing state (the events), or a replica failing now
    failures = [
        {"at": e.at, "state": e.to_state, "reason": e.reason, "replica": r}
        for r in replicas
        for e in r.events.all()
        if e.to_state in FAILING
    ] + [
        {"at": r.state_changed_at, "state": r.state, "reason": r.state_reason, "replica": r}
        for r in replicas
        if r.state in FAILING
    ]
    return {
        "counts": counts,
        "nodes": sorted(nodes),
        "npus": sum(len(r.allocations.all()) for r in replicas),
        "last_failure": max(failures, key=lambda f: f["at"], default=None),
    }


def _members(replica: Replica) -> list:
    """A multi-host replica's members, each with the NPUs it holds on its host."""
    chips = [a.accelerator for a in replica.allocations.all()]
    members = list(replica.members.select_related("node").order_by("rank"))
    for m in members:
        m.npus = sorted(c.npu_id for c in chips if c.node_id == m.node_id)
    return members


@require_POST
@role_required("operator")
def deployment_action(request, name: str, action: str):
    actor = actor_from_request(request)
    try:
        if action in ("start", "stop"):
            services.set_desired(
                actor=actor, name=name, state="running" if action == "start" else "stopped"
            )
        elif action == "restart":
            services.restart_deployment(actor=actor, name=name)
        elif action == "scale":
            services.set_desired(
                actor=actor,
                name=name,
                state=None,  # a scale keeps the desired state (read under the lock)
                replicas=int(request.POST.get("replicas") or -1),
            )
        elif action == "promote":
            rollout.promote(actor=actor, name=name)
        elif action == "rollback":
            rollout.roll_back_canary(actor=actor, name=name)
        elif action == "canary":
            percent = CanaryIn.model_validate({"percent": request.POST.get("percent") or 0})
            rollout.set_canary(actor=actor, name=name, percent=percent.percent)
        elif action == "delete":
            services.delete_deployment(actor=actor, name=name)
            messages.success(request, f"deployment {name} deleted")
            return redirect("deployment-list")
        messages.success(request, f"{name}: {action} requested")
    except ValidationError as exc:
        messages.error(request, describe(exc))
    except (DomainError, ValueError) as exc:
        messages.error(request, getattr(exc, "message", str(exc)))
    return redirect("deployment-detail", name=name)


@require_POST
@role_required("operator")
def deployment_autoscaler(request, name: str):
    """The autoscaling form: save the bounds and targets, or turn autoscaling off."""
    actor = actor_from_request(request)
    try:
        if request.POST.get("off"):
            autoscale.remove_policy(actor=actor, name=name)
            messages.success(request, f"{name}: autoscaling off; the replica count stays")
        else:
            fields = AutoscalerIn.model_validate(
                {k: request.POST.get(k) for k in autoscale.POLICY_FIELDS if request.POST.get(k)}
            ).model_dump()
            policy = autoscale.set_policy(actor=actor, name=name, fields=fields)
            messages.success(
                request,
                f"{name}: autoscaling {policy.min_replicas}..{policy.max_replicas} replicas",
            )
    except ValidationError as exc:
        messages.error(request, describe(exc))
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("deployment-detail", name=name)


@require_POST
@role_required("operator")
def try_prompt(request, name: str):
    """Send a real completion to a ready replica and show the answer and its latency."""
    dep = get_object_or_404(Deployment, name=name)
    ready = list(
        dep.replica_set.filter(state=ReplicaState.READY).select_related("node", "deployment")
    )
    real = [r for r in ready if not r.node.simulated]  # a simulated engine has no server
    replica = next((r for r in real if r.base_url is not None), None)
    context: dict = {"prompt": request.POST.get("prompt", "")[:2000]}
    if replica is None:
        if ready and not real:
            context["error"] = (
                "the ready replicas are on SIMULATED nodes: their engines are simulated "
                "and no server answers a prompt there"
            )
        else:
            context["error"] = "no replica is ready" + (
                " at a usable address (its node reports no IP address)" if real else ""
            )
        return render(request, "deployments/detail.html#answer", context)
    body = json.dumps(
        {"model": dep.served_model_name, "prompt": context["prompt"], "max_tokens": 32}
    ).encode()
    req = urllib.request.Request(  # noqa: S310 - base_url is http://<ip>:<port>, built by us
        f"{replica.base_url}/v1/completions",
        data=body,
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {engine_api_key(replica.pk)}",
        },
    )
    start = time.perf_counter()
    try:
        with _NO_PROXY.open(req, timeout=60) as resp:
            answer = json.loads(resp.read())
        context["answer"] = answer["choices"][0]["text"]
        context["usage"] = answer.get("usage", {})
    except (OSError, ValueError, KeyError) as exc:
        context["error"] = f"the engine did not answer: {exc}"
    context["latency_ms"] = round((time.perf_counter() - start) * 1000, 1)
    context["replica"] = replica
    return render(request, "deployments/detail.html#answer", context)


@role_required("viewer")
def replica_log(request, name: str, replica_id: int):
    """htmx: the last lines of a replica's current log, read from its host (task host.log_tail)."""
    from console.inventory.commands import NoAnswer, call
    from workers.contracts import Tasks

    replica = get_object_or_404(
        Replica.objects.select_related("node"), pk=replica_id, deployment__name=name
    )
    context = {"replica": replica}
    if replica.node is None:
        context["log_error"] = "the replica is not placed on a node"
    else:
        try:
            tail = call(
                replica.node.name, Tasks.HOST_LOG_TAIL, [replica.pk, -32768, 32768], timeout=5
            )
            tail = tail if isinstance(tail, dict) else {}
            # read from the host as written: masked here, as shipped logs are on the host
            context["log_lines"] = shown_lines(str(tail.get("text") or "").splitlines()[-200:])
            context["log_path"] = tail.get("path")
        except NoAnswer:
            context["log_error"] = f"the agent on {replica.node.name} did not answer within 5 s"
    return render(request, "deployments/detail.html#replica_log", context)
