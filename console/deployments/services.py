"""Writes to deployments and replicas. Views, API routes and tasks call these."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, has_role, record
from console.deployments import numa
from console.deployments import validation as v
from console.deployments.estimate import estimate_memory
from console.deployments.masking import restore_secrets, shown_env
from console.deployments.models import (
    REPLICA_TRANSITIONS,
    Deployment,
    DesiredState,
    NpuAllocation,
    Replica,
    ReplicaEvent,
    ReplicaState,
)
from console.deployments.schemas import DeploymentIn
from console.errors import Conflict, Invalid, NotFound
from console.inventory.models import Accelerator, Node, NodeStatus
from workers import engine_settings
from workers.engine.argv import redact_argv

log = logging.getLogger(__name__)
# The columns a spec writes: the engine settings (the one table) and the rest of the spec.
SPEC_FIELDS = (
    *engine_settings.NAMES,
    "model_path",
    "model_label",
    "served_model_name",
    "device",
    "extra_args",
    "extra_env",
    "replicas",
    "node_selector",
    "npus_per_replica",
    "nodes_per_replica",
    "preflight_override",
    "npu_ids",
    "reschedule_on_node_loss",
    "cpu_binding",
)


@dataclass
class CheckedSpec:
    """A spec that passed check_spec: the columns to write, with the model the agent read
    and the memory estimate."""

    fields: dict[str, Any]
    node: Node  # the node that inspected the model

    @property
    def model_info(self) -> dict:
        return self.fields["model_info"]

    @property
    def estimate(self) -> dict:
        return self.fields["estimate"]


def get_deployment(name: str) -> Deployment:
    dep = Deployment.objects.filter(name=name).select_related("pinned_node").first()
    if dep is None:
        raise NotFound(f"no deployment named {name!r}", field="name")
    return dep


def inspect_node(spec: dict) -> Node:
    """The node that reads the model's config.json: the pinned one, else an online match."""
    from console.deployments.scheduler import candidate_nodes

    probe = Deployment(
        pinned_node=spec.get("pinned_node"), node_selector=spec.get("node_selector") or {}
    )
    nodes = candidate_nodes(probe)
    if not nodes:
        raise Invalid(
            "no online node matches the placement, so the model cannot be inspected",
            field="pinned_node" if spec.get("pinned_node") else "node_selector",
        )
    return nodes[0]


def inspect_model(node: Node, path: str, timeout: float = 20.0) -> dict:
    """The model as the node's agent reads it (command host.model_inspect), waiting at most
    min(timeout, about a second): a record and a poll (console/deployments/inspection.py).
    Raises Invalid (model_path) for a refused model, InspectionPending (retry) meanwhile."""
    from console.deployments import inspection

    return inspection.result(node, path, wait=min(timeout, inspection.WAIT_S))


def check_spec(
    payload: DeploymentIn,
    *,
    deployment: str | None = None,
    inspect=None,
    actor: Actor | None = None,
) -> CheckedSpec:
    """The one intake of a spec, for create, update and the form's live check: every rule of
    validation.py, the NPUs asked for, the model as the agent reads it, the memory estimate.
    `deployment`: the one being changed (its own NPUs are not a conflict). `inspect`: a
    stand-in for the agent's model inspection (tests, the catalog's self-check). `actor`: who
    asks; flags and variables that make a host run code need the admin role
    (validation.check_privileges; no actor = not an admin)."""
    spec = payload.spec
    spec["pinned_node"] = _node_or_none(payload.pinned_node)
    spec["model_path"] = v.check_model_path(spec["model_path"])
    spec["block_size"] = v.check_block_size(spec.get("block_size"), spec.get("device", "npu"))
    if spec["device"] == "npu" and spec["block_size"] is None:
        spec["block_size"] = v.ASCEND_BLOCK_SIZE
    v.check_extra_args(spec.get("extra_args") or [])
    v.check_extra_env(spec.get("extra_env") or {})
    _check_privileges(spec, actor, deployment)
    v.check_parallelism(spec)
    _check_explicit_npus(spec, deployment)
    numa.check_binding(spec)
    node = inspect_node(spec)
    info = (inspect or inspect_model)(node, spec["model_path"])
    v.check_against_model(spec, info)
    hbm = _hbm_for(spec, node)
    est = estimate_memory(
        info,
        dtype=spec["dtype"],
        quantization=spec.get("quantization") or "",
        tp=spec["tensor_parallel_size"],
        pp=spec["pipeline_parallel_size"],
        dp=spec.get("data_parallel_size") or 1,
        max_model_len=spec.get("max_model_len"),
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        hbm_total_mb=hbm,
    )
    if not est["fits"]:
        raise Invalid(
            f"does not fit: {est['how']}; lower --max-model-len, raise --gpu-memory-utilization "
            "(max 0.99) or use more NPUs (TP)",
            field="gpu_memory_utilization",
        )
    # the manifest (checksums per file) is for comparing hosts (groups.check_weights, read
    # from the inspection record), not for the deployment's row and API
    spec["model_info"] = {k: v for k, v in info.items() if k != "manifest"}
    spec["estimate"] = est
    _check_torch_build(node)
    return CheckedSpec(fields=spec, node=node)


def _check_privileges(spec: dict, actor: Actor | None, deployment: str | None) -> None:
    """Admin-only flags, variables and settings (validation.check_privileges), compared with
    the stored deployment on an update."""
    admin = actor is not None and has_role(actor.user, Role.ADMIN)
    stored = None
    if deployment and not admin:
        columns = ("model_path", "extra_args", "extra_env", *engine_settings.NAMES)
        stored = Deployment.objects.filter(name=deployment).values(*columns).first()
    allowed = frozenset(settings.NPU_OPERATOR_ALLOWED_FLAGS + settings.NPU_OPERATOR_ALLOWED_ENV)
    v.check_privileges(spec, admin=admin, stored=stored, allowed=allowed)


def _check_explicit_npus(spec: dict, deployment: str | None = None) -> None:
    """Explicit NPU ids must exist on the pinned node, be healthy, not isolated and free.
    An NPU another deployment holds or has pinned is a Conflict (409) naming it."""
    ids, node = spec.get("npu_ids") or [], spec.get("pinned_node")
    if not ids or node is None:
        return
    _check_npu_holders(node, ids, deployment)
    chips = {
        a.npu_id: a
        for a in Accelerator.objects.filter(node=node, npu_id__in=ids).select_related("allocation")
        if a.chip_id == 0
    }
    for npu_id in ids:
        chip = chips.get(npu_id)
        problem = (
            "does not exist"
            if chip is None
            else f"is {chip.health}"
            if chip.health != "OK"
            else f"is isolated ({chip.isolation_reason})"
            if chip.isolated
            else "is in use by another replica"
            if hasattr(chip, "allocation")
            else ""
        )
        if problem:
            free = sorted(
                a.npu_id
                for a in Accelerator.objects.filter(
                    node=node, health="OK", isolated=False, allocation__isnull=True, chip_id=0
                )
            )
            raise Invalid(
                f"NPU {npu_id} on {node.name} {problem}; free healthy NPUs: {free}", field="npu_ids"
            )


def _hbm_for(spec: dict, node: Node) -> int | None:
    """A chip's memory on the node: HBM on 910B/A3; 310P cards report only DDR (npu-smi's
    Memory-Usage column), which is what their engines allocate from."""
    if spec["device"] != "npu":
        return None
    for acc in Accelerator.objects.filter(node=node).order_by("npu_id", "chip_id"):
        if acc.hbm_total_mb or acc.memory_total_mb:
            return acc.hbm_total_mb or acc.memory_total_mb
    return None


def _check_torch_build(node: Node) -> None:
    torch = str((node.software or {}).get("torch") or "")
    if any(tag in torch for tag in ("+cu", "+rocm")):
        raise Invalid(
            f"{node.name} has torch {torch}, a CUDA/ROCm build: on Ascend install the CPU torch "
            "wheel plus the matching torch-npu (see vllm-ascend's compatibility matrix)",
            field="device",
        )


def create_deployment(*, actor: Actor, payload: DeploymentIn, inspect=None) -> Deployment:
    """Create a deployment; with desired_state "running" it starts on the next reconcile
    (one call per intent: the API and the page both call only this)."""
    check_role(actor, Role.OPERATOR)
    if Deployment.objects.filter(name=payload.name).exists():
        raise Conflict(f"a deployment named {payload.name!r} exists", field="name")
    checked = check_spec(payload, inspect=inspect, actor=actor)
    with transaction.atomic():
        dep = Deployment.objects.create(
            name=payload.name,
            created_by=actor.user,
            desired_state=payload.desired_state,
            **checked.fields,
        )
        record(
            actor=actor,
            action="deployment.create",
            obj=dep,
            after={
                "desired_state": payload.desired_state,
                "spec": {"name": dep.name, **_audited(checked.fields)},
            },
        )
        if payload.desired_state == DesiredState.RUNNING:
            _kick_reconcile()
    return dep


def _audited(fields: dict[str, Any]) -> dict[str, Any]:
    """The spec as the audit log keeps it: the columns a user set (not the agent's model
    report nor the estimate), masked as viewers see them (console/deployments/masking.py):
    secret-named environment values, passwords inside URLs, secret flags' values."""
    out = {k: fields[k] for k in SPEC_FIELDS if k in fields}
    out["extra_args"] = redact_argv(list(fields.get("extra_args") or []))
    out["pinned_node"] = fields["pinned_node"].name if fields.get("pinned_node") else None
    out["extra_env"] = shown_env(fields.get("extra_env") or {})
    return out


def _check_npu_holders(node, ids: list[int], deployment: str | None) -> None:
    held = (
        NpuAllocation.objects.filter(
            accelerator__node=node, accelerator__npu_id__in=ids, accelerator__chip_id=0
        )
        .exclude(replica__deployment__name=deployment)
        .select_related("accelerator", "replica__deployment")
        .order_by("accelerator__npu_id")
        .first()
    )
    if held is not None:
        raise Conflict(
            f"NPU {held.accelerator.npu_id} on {node.name} is held by deployment "
            f"{held.replica.deployment.name!r} (replica {held.replica.index})",
            field="npu_ids",
        )
    others = Deployment.objects.filter(pinned_node=node).exclude(name=deployment)
    for name, pinned in others.values_list("name", "npu_ids"):
        shared = sorted(set(ids) & set(pinned or []))
        if shared:
            raise Conflict(
                f"NPU {shared[0]} on {node.name} is pinned by deployment {name!r}",
                field="npu_ids",
            )


def update_deployment(
    *, actor: Actor, name: str, payload: DeploymentIn, inspect=None
) -> Deployment:
    """Replace the spec; running replicas are replaced one at a time by a rolling update
    (console/deployments/rollout.py), rolled back automatically when the new one fails.

    check_spec (which may ask the agent) runs before the row lock; then the deployment is
    re-read under the lock and only the spec fields are written, with `spec_version` bumped
    past every version issued (next_spec_version): a start, stop, scale or restart committed
    meanwhile is kept. The
    desired state changes only when the request names it.

    A `***` where the API showed a secret (an extra_args flag value, a secret-named extra_env
    value) keeps the stored secret (console/deployments/masking.py restore_secrets): a GET ->
    PUT round trip never writes `***` over it; a `***` with nothing stored behind it is
    refused (422).

    Flags and variables only an admin may give (validation.check_privileges): an operator's
    update may keep exactly what the stored spec has (an admin set it) or remove it, may
    change every other field, but may not add one, change its value, or change the model
    while one is kept (422 naming the field)."""
    check_role(actor, Role.OPERATOR)
    if payload.name != name:
        raise Invalid("a deployment cannot be renamed", field="name")
    before = get_deployment(name)  # 404 before any work
    payload = _with_stored_secrets(payload, before)
    checked = check_spec(payload, inspect=inspect, deployment=name, actor=actor)
    fields = dict(checked.fields)
    if "desired_state" in payload.model_fields_set:
        fields["desired_state"] = payload.desired_state
    with transaction.atomic():
        dep = Deployment.objects.select_for_update().filter(name=name).first()
        if dep is None:
            raise NotFound(f"no deployment named {name!r}", field="name")
        for key, value in fields.items():
            setattr(dep, key, value)
        dep.spec_version = next_spec_version(dep)
        dep.updated_at = timezone.now()
        dep.save(update_fields=[*fields, "spec_version", "updated_at"])
        record(
            actor=actor,
            action="deployment.update",
            obj=dep,
            before={"spec": _audited(_columns(before))},
            after={"spec_version": dep.spec_version, "spec": _audited(checked.fields)},
        )
        _kick_reconcile()
    return dep


def _with_stored_secrets(payload: DeploymentIn, dep: Deployment) -> DeploymentIn:
    spec = {"extra_args": list(payload.extra_args), "extra_env": dict(payload.extra_env)}
    restore_secrets(spec, list(dep.extra_args or []), dict(dep.extra_env or {}))
    return payload.model_copy(update=spec)


def _columns(dep: Deployment) -> dict[str, Any]:
    return {k: getattr(dep, k) for k in SPEC_FIELDS} | {"pinned_node": dep.pinned_node}


def _node_or_none(name: str | None) -> Node | None:
    if not name:
        return None
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise Invalid(f"no node named {name!r}", field="pinned_node")
    return node


def set_desired(
    *, actor: Actor, name: str, state: str | None, replicas: int | None = None
) -> Deployment:
    """start / stop / scale: record what is wanted; the reconcile loop makes it so.
    state None keeps the desired state (a scale): read under the row lock, so a scale never
    undoes a start or stop committed while it waited."""
    check_role(actor, Role.OPERATOR)
    with transaction.atomic():
        dep = Deployment.objects.select_for_update().filter(name=name).first()
        if dep is None:
            raise NotFound(f"no deployment named {name!r}", field="name")
        before = {"desired_state": dep.desired_state, "replicas": dep.replicas}
        dep.desired_state = state or dep.desired_state
        if replicas is not None:
            if not 0 <= replicas <= 64:
                raise Invalid("replicas must be 0..64", field="replicas")
            from console.deployments.autoscale import check_manual_scale

            check_manual_scale(dep, replicas)
            if replicas < dep.replicas:
                _order_for_scale_down(dep)
            dep.replicas = replicas
        dep.save(update_fields=["desired_state", "replicas"])
        record(
            actor=actor,
            action=f"deployment.{'scale' if replicas is not None else state}",
            obj=dep,
            before=before,
            after={"desired_state": dep.desired_state, "replicas": dep.replicas},
        )
    _kick_reconcile()
    return dep


# Which replicas a scale-down keeps: the reconcile loop stops those whose index is at or past
# the new count, so the best are renumbered first — ready, then starting, then not running,
# then unknown, unhealthy and failed last (those go first).
_KEEP_ORDER = {
    ReplicaState.READY: 0,
    ReplicaState.LOADING: 1,
    ReplicaState.STARTING: 1,
    ReplicaState.SCHEDULED: 1,
    ReplicaState.PENDING: 2,
    ReplicaState.STOPPED: 2,
    ReplicaState.STOPPING: 2,
    ReplicaState.UNKNOWN: 3,
    ReplicaState.UNHEALTHY: 4,
    ReplicaState.FAILED: 5,
    ReplicaState.CRASH_LOOP: 5,
}


def _order_for_scale_down(dep: Deployment) -> None:
    """Renumber the deployment's replicas best first (in the caller's transaction, under the
    deployment's row lock): a scale-down then removes failed, unhealthy and not-ready replicas
    before a ready one."""
    current = list(Replica.objects.select_for_update().filter(deployment=dep).order_by("index"))
    wanted = sorted(current, key=lambda r: (_KEEP_ORDER.get(r.state, 2), r.index))
    if [r.pk for r in wanted] == [r.pk for r in current]:
        return
    offset = max(r.index for r in current) + 1  # two steps: (deployment, index) is unique
    for new, replica in enumerate(wanted):
        Replica.objects.filter(pk=replica.pk).update(index=offset + new)
    for new, replica in enumerate(wanted):
        Replica.objects.filter(pk=replica.pk).update(index=new)


def next_spec_version(dep: Deployment) -> int:
    """The version a spec change or an asked restart gets (call under the deployment's row
    lock): past every version ever issued, also one a rollback went back from
    (console/deployments/rollout.py), so a version number always means one spec."""
    from django.db.models import Max

    rolled = dep.rollouts.aggregate(top=Max("to_version"))["top"] or 0
    return max(dep.spec_version, rolled) + 1


def restart_deployment(*, actor: Actor, name: str) -> Deployment:
    """Restart every replica: bump the spec version, so each gets a new generation — a
    rolling restart, one replica at a time (console/deployments/rollout.py)."""
    check_role(actor, Role.OPERATOR)
    with transaction.atomic():
        dep = Deployment.objects.select_for_update().filter(name=name).first()
        if dep is None:
            raise NotFound(f"no deployment named {name!r}", field="name")
        version = next_spec_version(dep)
        Deployment.objects.filter(pk=dep.pk).update(spec_version=version)
        record(
            actor=actor,
            action="deployment.restart",
            obj=dep,
            after={"spec_version": version},
        )
    _kick_reconcile()
    return get_deployment(name)


def delete_deployment(*, actor: Actor, name: str) -> None:
    check_role(actor, Role.OPERATOR)
    dep = get_deployment(name)
    if dep.replica_set.exclude(state__in=[ReplicaState.STOPPED, ReplicaState.PENDING]).exists():
        raise Conflict(
            "stop the deployment and wait for its replicas to stop before deleting it", field="name"
        )
    with transaction.atomic():
        record(
            actor=actor,
            action="deployment.delete",
            obj=dep,
            before={
                "desired_state": dep.desired_state,
                "spec": {"name": dep.name, **_audited(_columns(dep))},
            },
        )
        dep.delete()


def _kick_reconcile() -> None:
    def send():
        try:
            from console.celery import app

            app.send_task("deployments.reconcile", queue="console", ignore_result=True)
        except Exception:  # noqa: BLE001 - the beat runs it anyway within seconds
            log.warning("could not queue a reconcile; the beat will run it")

    transaction.on_commit(send)


def transition_replica(replica: Replica, to: str, reason: str, **fields) -> bool:
    """One conditional UPDATE from the replica's current state, and its event.

    Returns False when the state changed under us (someone else got there first) or the
    transition is not in REPLICA_TRANSITIONS (logged, nothing written).
    """
    frm = replica.state
    if to != frm and to not in REPLICA_TRANSITIONS[frm]:
        log.warning("replica %s: refusing %s -> %s (%s)", replica, frm, to, reason)
        return False
    now = timezone.now()
    changed = Replica.objects.filter(pk=replica.pk, state=frm).update(
        state=to, state_reason=reason[:500], state_changed_at=now, **fields
    )
    if not changed:
        return False
    if to != frm:
        ReplicaEvent.objects.create(
            replica=replica,
            at=now,
            from_state=frm,
            to_state=to,
            reason=reason[:500],
            generation=fields.get("generation", replica.generation),
        )
    replica.state, replica.state_reason, replica.state_changed_at = to, reason, now
    for key, value in fields.items():
        setattr(replica, key, value)
    return True


def node_went_offline(node: Node) -> int:
    """Replicas of an offline node become `unknown`: never stopped, never deleted."""
    from console.deployments.groups import replicas_with_member_on

    n = 0
    for replica in replicas_with_member_on(node).exclude(
        state__in=[ReplicaState.STOPPED, ReplicaState.PENDING, ReplicaState.UNKNOWN]
    ):
        n += transition_replica(
            replica,
            ReplicaState.UNKNOWN,
            f"node {node.name} is {NodeStatus.OFFLINE}: "
            "no heartbeat; the engine may still be serving",
        )
    return n
