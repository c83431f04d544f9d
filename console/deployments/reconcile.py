"""The reconcile loop: make actual replicas converge on what deployments want.

Runs from the beat every few seconds and after every start/stop/scale. Idempotent: each step
is a conditional state transition, so two overlapping runs cannot both act on one replica.
A spec change or an asked restart is rolled out replica by replica (rollout.py), which owns
the replicas of its current step: this loop leaves those alone.
A lost heartbeat alone never stops an engine: replicas of an offline node become `unknown`
and are moved elsewhere only when the deployment allows it.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from console.deployments import groups, numa, rollout, scheduler
from console.deployments.engines import dispatch_start, dispatch_stop_replica
from console.deployments.models import Deployment, DesiredState, Replica, ReplicaState
from console.deployments.services import node_went_offline, transition_replica
from console.inventory.models import Node, NodeStatus

log = logging.getLogger(__name__)
S = ReplicaState
ACK_TIMEOUT = timedelta(seconds=90)  # scheduled but no word from the agent
NODE_LOSS_GRACE = timedelta(minutes=2)
STOPPED_LIKE = {S.STOPPED, S.PENDING}


def reconcile() -> dict[str, int]:
    """One pass over every deployment. Returns counts of what it did."""
    done = {"scheduled": 0, "stopping": 0, "unknown": 0}
    offline = Node.objects.filter(status=NodeStatus.OFFLINE).filter(
        Q(replicas__isnull=False) | Q(replica_members__isnull=False)
    )
    for node in offline.distinct():
        done["unknown"] += node_went_offline(node)
    latest = _latest()
    done["repaired"] = repair_from_heartbeats()
    for dep in Deployment.objects.all():
        want = dep.replicas if dep.desired_state == DesiredState.RUNNING else 0
        for index in range(want):
            Replica.objects.get_or_create(deployment=dep, index=index)
        owned = _rolling(dep, latest)
        for replica in dep.replica_set.select_related("node").order_by("index"):
            if replica.pk in owned or _owned_since(replica, want):
                continue
            if replica.index < want:
                done["scheduled"] += _converge_running(dep, replica, latest)
            else:
                done["stopping"] += _converge_stopped(dep, replica)
    return done


def _rolling(dep: Deployment, latest: dict) -> set[int]:
    """The rolling update's pass over `dep` (rollout.advance); a failure there is logged and
    never stops the loop over the other deployments."""
    try:
        return rollout.advance(dep, latest)
    except Exception:  # noqa: BLE001 - one deployment's rollout must not stall them all
        log.exception("rolling update of %s failed this pass", dep.name)
        return set()


def _owned_since(replica: Replica, want: int) -> bool:
    """A row this pass would start or stop that a concurrent pass's rolling update owns, or
    renumbered, since the rows were listed (read fresh; only for those it would act on)."""
    if replica.index < want and replica.state not in STOPPED_LIKE:
        return False
    if (
        replica.index >= want
        and not Replica.objects.filter(pk=replica.pk, index__gte=want).exists()
    ):
        return True  # a surge row that took an old one's index meanwhile
    return rollout.owns(replica.pk)


def _latest() -> dict:
    from console.telemetry.services import latest_many

    try:
        return latest_many(
            Node.objects.filter(status=NodeStatus.ONLINE).values_list("name", flat=True)
        )
    except Exception:  # noqa: BLE001 - Redis down: place without load data
        return {}


def repair_from_heartbeats() -> int:
    """Apply what agents' heartbeats say about engines when it differs from the database:
    a report lost in transit is corrected within one reconcile pass. Each node's view is read
    from its own key and applied as that node's; an entry that does not validate (whatever
    was planted in Redis) is skipped and logged, never raised (engines.engine_reports)."""
    from console.deployments.engines import PHASE_TO_STATE, apply_report, engine_reports
    from console.hot import get_redis
    from console.inventory.heartbeats import engines_key

    names = list(Node.objects.filter(status=NodeStatus.ONLINE).values_list("name", flat=True))
    if not names:
        return 0
    try:
        blobs = get_redis().mget([engines_key(n) for n in names])
    except Exception:  # noqa: BLE001 - Redis down: nothing to repair from
        return 0
    reports = [
        r
        for name, blob in zip(names, blobs, strict=True)
        if blob
        for r in engine_reports(name, blob)
    ]
    known = Replica.objects.filter(pk__in={r.replica_id for r in reports})
    current = {
        pk: (state, gen) for pk, state, gen in known.values_list("pk", "state", "generation")
    }
    repaired = 0
    for r in reports:
        state, generation = current.get(r.replica_id, (None, None))
        if generation == r.generation and PHASE_TO_STATE.get(r.phase) != state:
            repaired += apply_report(r.model_dump(mode="json"), node=r.node) is not None
    return repaired


def _converge_running(dep: Deployment, replica: Replica, latest: dict) -> int:
    now = timezone.now()
    if replica.state in STOPPED_LIKE:
        return _schedule(dep, replica, latest)
    if replica.state == S.SCHEDULED and now - replica.state_changed_at > ACK_TIMEOUT:
        with transaction.atomic():
            if transition_replica(
                replica,
                S.FAILED,
                f"the agent on {replica.node} did not acknowledge the start "
                f"within {ACK_TIMEOUT.seconds}s",
            ):
                scheduler.release(replica)
        return 0
    if (
        replica.state == S.UNKNOWN
        and dep.reschedule_on_node_loss
        and now - replica.state_changed_at > NODE_LOSS_GRACE
    ):
        with transaction.atomic():
            if transition_replica(
                replica,
                S.PENDING,
                f"node {replica.node} lost for over "
                f"{NODE_LOSS_GRACE.seconds}s; rescheduling as the deployment allows",
            ):
                scheduler.release(replica)
                Replica.objects.filter(pk=replica.pk).update(node=None)
        return 0
    if replica.state == S.FAILED and dep.nodes_per_replica > 1:
        return _restart_group(dep, replica)
    return 0  # a running replica on an older spec: the rolling update replaces it


def _restart_group(dep: Deployment, replica: Replica) -> int:
    """A member of a multi-host replica failed: after the group's backoff every member starts
    again with a new generation, or the group gives up (crash-loop) and every member is told
    to stop (groups.py)."""
    give_up, why = groups.restart_due(replica)
    if not why:
        return 0
    with transaction.atomic():
        if give_up:
            if transition_replica(replica, S.CRASH_LOOP, why):
                dispatch_stop_replica(replica)
            return 0
        if transition_replica(
            replica,
            S.STARTING,
            why,
            generation=replica.generation + 1,
            spec_version=dep.spec_version,
            restarts=replica.restarts + 1,
        ):
            dispatch_start(replica)
    return 1


def _schedule(dep: Deployment, replica: Replica, latest: dict) -> int:
    with transaction.atomic():
        replica = (
            Replica.objects.select_for_update(of=("self",))
            .select_related("deployment")
            .filter(pk=replica.pk)
            .first()
        )
        if replica is None:  # a concurrent pass scaled it away since this one listed it
            return 0
        if replica.state not in STOPPED_LIKE:
            return 0
        if replica.state == S.STOPPED:
            transition_replica(replica, S.PENDING, "deployment wants it running")
        try:
            placed = scheduler.place(replica, latest)
        except scheduler.NoCapacity as exc:
            if replica.state_reason != f"waiting for capacity: {exc}":
                Replica.objects.filter(pk=replica.pk).update(
                    state_reason=f"waiting for capacity: {exc}"[:500]
                )
            return 0
        preflight = ""
        if dep.nodes_per_replica > 1:
            preflight = _group_ready_to_start(replica)
            if preflight is None:
                return 0
        npus = ",".join(str(a.npu_id) for a in placed.accelerators) or "none (CPU)"
        replica.node, replica.port = placed.node, placed.port
        binding = ""
        if dep.cpu_binding == numa.NUMA:  # the event says where it is bound, or why not
            binding = "; " + numa.replica_numa(placed.node, placed.accelerators)[1]
        where = f"placed on {placed.node.name}, NPUs {npus}, port {placed.port}"
        if dep.nodes_per_replica > 1:
            where = (
                "placed as a group: "
                + "; ".join(
                    f"rank {m.rank} on {m.node.name} (NPUs "
                    f"{','.join(str(a.npu_id) for a in placed.accelerators if a.node_id == m.node_id) or 'none'})"
                    for m in groups.members(replica)
                )
                + f"; API port {placed.port} and DP RPC port {replica.rpc_port} on the leader"
                + (f"; {preflight}" if preflight else "")
            )
        transition_replica(
            replica,
            S.SCHEDULED,
            f"{where}{binding}",
            generation=replica.generation + 1,
            spec_version=dep.spec_version,
        )
        dispatch_start(replica)
    return 1


def _group_ready_to_start(replica: Replica) -> str | None:
    """Every member's host has reported what its place in the group needs, the NPU-network
    preflight passes (or is overridden: what to record is returned), every member's agent
    read the same model and the members reach each other (network probes); if not (None),
    the gang's hold is released again and the replica waits, saying why (checked each pass)."""
    replica.refresh_from_db(fields=["rpc_port"])
    try:
        leader = groups.members(replica)[0]
        for member in groups.members(replica):
            groups.group_spec(replica, member, leader)
        preflight = groups.check_preflight(replica)
        groups.check_weights(replica)
        network = groups.check_connectivity(replica)  # its override first: events hold 500
        return "; ".join(r for r in (network, preflight) if r)
    except (groups.NoNetworkFacts, groups.PreflightFailed, groups.WeightsUnconfirmed) as exc:
        scheduler.release(replica)
        Replica.objects.filter(pk=replica.pk).update(node=None, state_reason=str(exc)[:500])
        return None


def _converge_stopped(dep: Deployment, replica: Replica) -> int:
    with transaction.atomic():
        if replica.state == S.PENDING:
            transition_replica(replica, S.STOPPED, "not wanted")
            scheduler.release(replica)
        if replica.state == S.STOPPED:
            if replica.index >= dep.replicas:  # scaled down: the row goes, its events with it
                replica.delete()
            return 0
        if replica.state == S.STOPPING:
            return 0
        if replica.node is None:
            transition_replica(replica, S.STOPPED, "never placed")
            return 0
        if transition_replica(replica, S.STOPPING, "deployment wants it stopped"):
            dispatch_stop_replica(replica)
            return 1
    return 0
