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


def free_port(node: Node, also_taken: frozenset[int] = frozenset()) -> int:
    """The lowest port of the range that no replica holds on `node` (its API port or, for a
    multi-host leader, its DP RPC port) and nothing else listens on there (the agent's report,
    or a start refused on it: console/inventory/ports.py)."""
    held = Replica.objects.filter(node=node).values_list("port", "rpc_port")
    used = {p for pair in held for p in pair if p is not None} | set(also_taken)
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
    """Candidate (node, chips to use) pairs, best first (for a multi-host replica: each
    host's share of its NPUs)."""
    need = npus_per_host(deployment)
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


def npus_per_host(deployment: Deployment) -> int:
    if deployment.device != "npu":
        return 0
    return deployment.npus_per_replica // max(1, deployment.nodes_per_replica)


def place(replica: Replica, latest: dict[str, dict | None]) -> Placement:
    """Choose and hold a node, chips and port for `replica` (in the caller's transaction).
    A replica over several hosts is placed as a gang (place_group)."""
    deployment = replica.deployment
    if deployment.nodes_per_replica > 1:
        return place_group(replica, latest)
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


NETWORK_DOMAIN_LABEL = "network-domain"  # e.g. the switch or A3 superpod a node hangs off


def choose_hosts(
    options: list[tuple[Node, list[Accelerator]]], hosts: int
) -> list[tuple[Node, list[Accelerator]]]:
    """`hosts` of the ranked candidates, best first: from one network domain (the node label
    NETWORK_DOMAIN_LABEL) when one has enough of them — the one whose best members rank
    highest — else the best across domains. [] when there are too few."""
    if len(options) < hosts:
        return []
    domains: dict[str, list[tuple[Node, list[Accelerator]]]] = {}
    for option in options:
        domain = (option[0].labels or {}).get(NETWORK_DOMAIN_LABEL)
        if domain:
            domains.setdefault(domain, []).append(option)
    complete = [members[:hosts] for members in domains.values() if len(members) >= hosts]
    if complete:
        return min(complete, key=lambda members: [options.index(m) for m in members])
    return options[:hosts]


def place_group(replica: Replica, latest: dict[str, dict | None]) -> Placement:
    """Hold NPUs on `nodes_per_replica` hosts, the leader's API and DP RPC ports, and one
    member row per host, all in one transaction or none (a gang): a replica never holds part
    of what it needs. The leader (rank 0) is the best-ranked host."""
    from console.deployments.models import ReplicaMember

    deployment = replica.deployment
    hosts = deployment.nodes_per_replica
    chosen = choose_hosts(rank(deployment, latest), hosts)
    if not chosen:
        raise NoCapacity(explain_no_group_capacity(deployment, latest))
    try:
        with transaction.atomic():
            ReplicaMember.objects.filter(replica=replica).delete()
            NpuAllocation.objects.bulk_create(
                [
                    NpuAllocation(accelerator=c, replica=replica)
                    for _, chips in chosen
                    for c in chips
                ]
            )
            leader = chosen[0][0]
            port = free_port(leader)
            rpc_port = free_port(leader, frozenset({port}))
            ReplicaMember.objects.bulk_create(
                [
                    ReplicaMember(replica=replica, rank=r, node=node)
                    for r, (node, _) in enumerate(chosen)
                ]
            )
            Replica.objects.filter(pk=replica.pk).update(node=leader, port=port, rpc_port=rpc_port)
    except IntegrityError:  # a chip or a port was taken meanwhile: the next pass tries again
        raise NoCapacity("a chip or port was taken by a concurrent placement; retrying") from None
    return Placement(node=leader, accelerators=[c for _, chips in chosen for c in chips], port=port)


def explain_no_group_capacity(deployment: Deployment, latest: dict[str, dict | None]) -> str:
    need, hosts = npus_per_host(deployment), deployment.nodes_per_replica
    fit = [node.name for node, _ in rank(deployment, latest)]
    return (
        f"needs {hosts} online hosts with {need} free healthy NPUs each"
        + (f" matching {deployment.node_selector}" if deployment.node_selector else "")
        + f"; {len(fit)} ha{'s' if len(fit) == 1 else 've'} them"
        + (f" ({', '.join(fit[:8])})" if fit else "")
    )


ROOM_UNBOUNDED = 64  # the most replicas a deployment may have: nothing else bounds CPU ones


def room(deployment: Deployment) -> int:
    """How many more replicas of `deployment` could be placed now: whole replicas' worth of
    free healthy chips on the nodes it may use (for a multi-host replica, each on its own
    hosts), less its replicas already waiting for a place. What the autoscaler asks for."""
    waiting = Replica.objects.filter(
        deployment=deployment,
        index__lt=deployment.replicas,
        state__in=("pending", "stopped"),
        node__isnull=True,
    ).count()
    nodes = candidate_nodes(deployment)
    need = npus_per_host(deployment)
    if not nodes:
        return 0
    if need == 0:
        return ROOM_UNBOUNDED - waiting
    shares = sorted((len(free_chips(n, deployment)) // need for n in nodes), reverse=True)
    hosts, fits = max(1, deployment.nodes_per_replica), 0
    while len(shares) >= hosts and shares[hosts - 1] > 0:  # one share from each of the best
        shares = sorted((s - 1 if i < hosts else s for i, s in enumerate(shares)), reverse=True)
        fits += 1
    return max(0, fits - waiting)


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
    """Free the replica's chips and ports, on every host (idempotent). The member rows stay
    (they say where a stopped group ran) until the next placement replaces them."""
    NpuAllocation.objects.filter(replica=replica).delete()
    Replica.objects.filter(pk=replica.pk).update(port=None, rpc_port=None)
