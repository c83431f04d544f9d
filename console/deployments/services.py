"""Writes to deployments and replicas. Views, API routes and tasks call these."""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.deployments import validation as v
from console.deployments.estimate import estimate_memory
from console.deployments.models import (
    REPLICA_TRANSITIONS,
    Deployment,
    DesiredState,
    NpuAllocation,
    Replica,
    ReplicaEvent,
    ReplicaState,
)
from console.errors import Conflict, Invalid, NotFound
from console.inventory.models import Accelerator, Node, NodeStatus

log = logging.getLogger(__name__)
SPEC_FIELDS = (
    "model_path",
    "model_label",
    "served_model_name",
    "device",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "block_size",
    "swap_space",
    "enforce_eager",
    "quantization",
    "trust_remote_code",
    "extra_args",
    "extra_env",
    "replicas",
    "node_selector",
    "npus_per_replica",
    "npu_ids",
    "reschedule_on_node_loss",
)


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
    """Ask the node's agent to read the model directory (command host.model_inspect)."""
    from console.inventory.commands import NoAnswer, call
    from workers.contracts import Tasks

    try:
        info = call(node.name, Tasks.HOST_MODEL_INSPECT, [path], timeout=timeout)
    except NoAnswer:
        raise Invalid(
            f"the agent on {node.name} did not answer the model inspection within {timeout:g}s",
            field="model_path",
        ) from None
    if not isinstance(info, dict):
        raise Invalid(f"the agent on {node.name} answered nonsense", field="model_path")
    if not info.get("ok"):
        raise Invalid(
            f"{info.get('error') or 'cannot read the model'} (on {node.name})", field="model_path"
        )
    return info


def validate_spec(spec: dict, *, inspect=None, deployment: str | None = None) -> dict:
    """Check a full spec; returns it completed with model_info and the memory estimate.
    `deployment`: the one being changed (its own NPUs are not a conflict)."""
    spec["model_path"] = v.check_model_path(spec["model_path"])
    spec["block_size"] = v.check_block_size(spec.get("block_size"), spec.get("device", "npu"))
    if spec["device"] == "npu" and spec["block_size"] is None:
        spec["block_size"] = v.ASCEND_BLOCK_SIZE
    v.check_extra_args(spec.get("extra_args") or [])
    v.check_extra_env(spec.get("extra_env") or {})
    v.check_parallelism(spec)
    _check_explicit_npus(spec, deployment)
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
    spec["model_info"], spec["estimate"] = info, est
    _check_torch_build(node)
    return spec


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


def create_deployment(
    *,
    actor: Actor,
    name: str,
    spec: dict,
    pinned_node: str | None,
    desired_state: str = DesiredState.STOPPED,
    inspect=None,
) -> Deployment:
    check_role(actor, Role.OPERATOR)
    if Deployment.objects.filter(name=name).exists():
        raise Conflict(f"a deployment named {name!r} exists", field="name")
    spec["pinned_node"] = _node_or_none(pinned_node)
    spec = validate_spec(spec, inspect=inspect)
    with transaction.atomic():
        dep = Deployment.objects.create(
            name=name,
            created_by=actor.user,
            desired_state=desired_state,
            **{
                k: spec[k]
                for k in (*SPEC_FIELDS, "pinned_node", "model_info", "estimate")
                if k in spec
            },
        )
        record(
            actor=actor, action="deployment.create", obj=dep, after={"desired_state": desired_state}
        )
    return dep


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
    *, actor: Actor, name: str, spec: dict, pinned_node: str | None, inspect=None
) -> Deployment:
    """Replace the spec; running replicas restart with a new generation on the next reconcile.

    Validation (which may ask the agent) runs before the row lock; then the deployment is
    re-read under the lock and only the spec fields are written, with `spec_version` bumped by
    the database (F()): a start, stop, scale or restart committed meanwhile is kept."""
    check_role(actor, Role.OPERATOR)
    get_deployment(name)  # 404 before any work
    spec["pinned_node"] = _node_or_none(pinned_node)
    spec = validate_spec(spec, inspect=inspect, deployment=name)
    fields = [k for k in (*SPEC_FIELDS, "pinned_node", "model_info", "estimate") if k in spec]
    with transaction.atomic():
        dep = Deployment.objects.select_for_update().filter(name=name).first()
        if dep is None:
            raise NotFound(f"no deployment named {name!r}", field="name")
        for key in fields:
            setattr(dep, key, spec[key])
        dep.spec_version = F("spec_version") + 1
        dep.updated_at = timezone.now()
        dep.save(update_fields=[*fields, "spec_version", "updated_at"])
        dep.refresh_from_db(fields=["spec_version"])
        record(
            actor=actor,
            action="deployment.update",
            obj=dep,
            after={"spec_version": dep.spec_version},
        )
    return dep


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


def restart_deployment(*, actor: Actor, name: str) -> Deployment:
    """Restart every replica: bump the spec version, so each gets a new generation."""
    check_role(actor, Role.OPERATOR)
    with transaction.atomic():
        dep = get_deployment(name)
        Deployment.objects.filter(pk=dep.pk).update(spec_version=F("spec_version") + 1)
        record(actor=actor, action="deployment.restart", obj=dep)
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
        record(actor=actor, action="deployment.delete", obj=dep)
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
    n = 0
    for replica in Replica.objects.filter(node=node).exclude(
        state__in=[ReplicaState.STOPPED, ReplicaState.PENDING, ReplicaState.UNKNOWN]
    ):
        n += transition_replica(
            replica,
            ReplicaState.UNKNOWN,
            f"node {node.name} is {NodeStatus.OFFLINE}: "
            "no heartbeat; the engine may still be serving",
        )
    return n
