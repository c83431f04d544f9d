"""Placement: pick a node and NPU ids for a replica, and hold them in the database.

Candidates are online, active nodes matching the selector (or the pinned node) with enough
healthy, non-isolated, unallocated chips. Preference: fewer replicas of this deployment on the
node (spread), then the least-loaded chips (HBM used, AICore % from the latest heartbeat).
Allocation rows are unique per chip, so two concurrent placements can never share one:
the loser's insert fails and it tries the next candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Q

from console.deployments import numa
from console.deployments.models import HOLDS_NPUS, Deployment, NpuAllocation, Replica
from console.inventory import ports
from console.inventory.models import Accelerator, Health, Node, NodeStatus


@dataclass
class Placement:
    node: Node
    accelerators: list[Accelerator]
    port: int


class NoCapacity(Exception):
    """No node can take the replica now; the message says why (shown on the replica)."""


def candidate_nodes(deployment: Deployment) -> list[Node]:
    nodes = Node.objects.filter(status=NodeStatus.ONLINE)
    if deployment.pinned_node_id:
        nodes = nodes.filter(pk=deployment.pinned_node_id)
    selector = deployment.node_selector or {}
    return [
        n
        for n in nodes
        if all(
            key in n.labels and (not value or n.labels[key] == value)
            for key, value in selector.items()
        )
    ]


def free_chips(node: Node, deployment: Deployment) -> list[Accelerator]:
    qs = Accelerator.objects.filter(
        node=node, health=Health.OK, isolated=False, allocation__isnull=True
    )
    if deployment.npu_ids:
        qs = qs.filter(npu_id__in=deployment.npu_ids)
    return list(qs)


def _load(latest: dict | None, chip: Accelerator) -> tuple[float, float]:
    for c in (latest or {}).get("chips") or []:
        if c["npu_id"] == chip.npu_id and c.get("chip_id", 0) == chip.chip_id:
            total = c.get("hbm_total_mb") or c.get("memory_total_mb") or 1
            used = c.get("hbm_used_mb") if c.get("hbm_total_mb") else c.get("memory_used_mb")
            return (used or 0) / total, (c.get("aicore_percent") or 0) / 100
    return 0.0, 0.0


def port_range() -> range:
    return settings.ENGINE_PORT_RANGE


def free_port(node: Node) -> int:
    """The lowest port of the range that no replica holds on `node` and nothing else listens
    on there (the agent's report, or a start refused on it: console/inventory/ports.py)."""
    used = set(Replica.objects.filter(node=node, port__isnull=False).values_list("port", flat=True))
    used |= ports.taken(node.name)
    candidates = port_range()
    for port in candidates:
        if port not in used:
            return port
    raise NoCapacity(
        f"no free engine port on {node.name} in {candidates.start}-{candidates.stop - 1}"
    )


def rank(
    deployment: Deployment, latest: dict[str, dict | None]
) -> list[tuple[Node, list[Accelerator]]]:
    """Candidate (node, chips to use) pairs, best first."""
    need = deployment.npus_per_replica if deployment.device == "npu" else 0
    spread = dict(
        Replica.objects.filter(deployment=deployment, state__in=HOLDS_NPUS)
        .values_list("node_id")
        .annotate(n=Count("id"))
        .values_list("node_id", "n")
    )
    options = []
    for node in candidate_nodes(deployment):
        chips = sorted(free_chips(node, deployment), key=lambda c: _load(latest.get(node.name), c))
        if len(chips) >= need:
            # bound to its NPUs' NUMA node: all of a replica's chips on one node when possible
            if deployment.cpu_binding == numa.NUMA:
                chips = numa.prefer_one_node(chips, need)
            options.append(
                (
                    spread.get(node.pk, 0),
                    sum(_load(latest.get(node.name), c)[0] for c in chips[:need]),
                    node.name,
                    node,
                    chips[:need],
                )
            )
    options.sort(key=lambda o: o[:3])
    return [(o[3], o[4]) for o in options]


def place(replica: Replica, latest: dict[str, dict | None]) -> Placement:
    """Choose and hold a node, chips and port for `replica` (in the caller's transaction)."""
    deployment = replica.deployment
    options = rank(deployment, latest)
    if not options:
        raise NoCapacity(explain_no_capacity(deployment))
    for node, chips in options:
        try:
            with transaction.atomic():
                NpuAllocation.objects.bulk_create(
                    [NpuAllocation(accelerator=c, replica=replica) for c in chips]
                )
                port = free_port(node)
                Replica.objects.filter(pk=replica.pk).update(node=node, port=port)
            return Placement(node=node, accelerators=chips, port=port)
        except IntegrityError:  # someone took a chip or the port first: next candidate
            continue
    raise NoCapacity("every candidate was taken by a concurrent placement; retrying")


def explain_no_capacity(deployment: Deployment) -> str:
    nodes = candidate_nodes(deployment)
    if not nodes:
        where = f"node {deployment.pinned_node}" if deployment.pinned_node_id else "no online node"
        sel = f" matching {deployment.node_selector}" if deployment.node_selector else ""
        return f"{where}{sel} is online and active"
    best = max(nodes, key=lambda n: len(free_chips(n, deployment)))
    counts = Accelerator.objects.filter(node=best).aggregate(
        total=Count("id"),
        isolated=Count("id", filter=Q(isolated=True)),
        unhealthy=Count("id", filter=~Q(health=Health.OK)),
        busy=Count("id", filter=Q(allocation__isnull=False)),
    )
    return (
        f"needs {deployment.npus_per_replica} free healthy NPUs; best node {best.name} has "
        f"{len(free_chips(best, deployment))} ({counts['busy']} in use, {counts['isolated']} isolated, "
        f"{counts['unhealthy']} not OK, of {counts['total']})"
    )


def release(replica: Replica) -> None:
    """Free the replica's chips and port (idempotent)."""
    NpuAllocation.objects.filter(replica=replica).delete()
    Replica.objects.filter(pk=replica.pk).update(port=None)
