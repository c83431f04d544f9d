"""CPU binding of a deployment's engines to their NPUs' NUMA nodes (Deployment.cpu_binding).

The console decides the nodes from what the agents reported — each chip's NUMA node
(Accelerator.numa_node) and the host's layout (Node.numa_nodes) — and the agent applies them:
EngineSpec.numa_nodes -> `numactl --cpunodebind=N --membind=N` (workers/engine/numa.py, which
checks the host's real layout again before it starts anything). A replica whose NPUs sit on
two nodes is bound to both. docs/operations.md, "NUMA and CPU binding".

Guarantees: a pinned deployment whose NPUs report no NUMA node is refused at create/update
(Invalid, field cpu_binding); an unpinned one is placed anyway and the replica's "scheduled"
event says the binding was skipped and why. Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from console.errors import Invalid
from console.inventory.models import Accelerator, Node

NUMA = "numa"
SKIPPED = "CPU binding skipped"


def _npus(chips: Sequence[Accelerator]) -> str:
    return ",".join(str(n) for n in sorted({c.npu_id for c in chips}))


def replica_numa(node: Node, chips: Sequence[Accelerator]) -> tuple[list[int], str]:
    """(the NUMA nodes to bind a replica holding `chips` on `node` to, the words for its
    event). No nodes: the binding is skipped, and the words say why."""
    if not chips:
        return [], f"{SKIPPED}: the replica holds no NPU"
    unknown = [c for c in chips if c.numa_node is None]
    if unknown:
        return [], (
            f"{SKIPPED}: NPU {_npus(unknown)} on {node.name} reports no NUMA node (its agent "
            "sends none, or the firmware gives none: sysfs numa_node -1)"
        )
    nodes = sorted({c.numa_node for c in chips if c.numa_node is not None})
    layout = {n.get("node"): n.get("cpus") for n in node.numa_nodes or []}
    for n in nodes:
        if layout and n not in layout:
            known = ",".join(str(k) for k in sorted(layout))
            return [], f"{SKIPPED}: NUMA node {n} is not in {node.name}'s layout (nodes {known})"
        if layout and not layout[n]:
            return [], f"{SKIPPED}: NUMA node {n} of {node.name} has no CPUs"
    return nodes, f"CPU binding: NUMA node {','.join(map(str, nodes))}"


def check_binding(spec: dict) -> None:
    """At create and update: CPU binding only for NPU engines, and on a pinned node only
    where the NPUs asked for (all of its NPUs, without explicit ids: at least one) report a
    NUMA node in the host's layout. Raises Invalid (field cpu_binding)."""
    if spec.get("cpu_binding") != NUMA:
        return
    if spec.get("device") != "npu":
        raise Invalid(
            "CPU binding follows the NPUs' NUMA nodes: it applies to device npu only",
            field="cpu_binding",
        )
    node: Node | None = spec.get("pinned_node")
    if node is None:
        return  # decided at placement; skipped with a reason when the NPUs say nothing
    ids = spec.get("npu_ids") or []
    chips = Accelerator.objects.filter(node=node)
    if ids:
        nodes, words = replica_numa(node, list(chips.filter(npu_id__in=ids)))
        if not nodes:
            raise Invalid(
                words.replace(f"{SKIPPED}: ", "cannot bind CPUs: ", 1), field="cpu_binding"
            )
    elif not chips.filter(numa_node__isnull=False).exists():
        raise Invalid(
            f"cannot bind CPUs: no NPU on {node.name} reports a NUMA node (its agent sends "
            "none, or the firmware gives none); set CPU binding off",
            field="cpu_binding",
        )


def prefer_one_node(chips: Sequence[Accelerator], need: int) -> list[Accelerator]:
    """`need` of `chips` (best first), all on one NUMA node when one has enough of them —
    the node of the best chip that can — else the best `need` (a replica on two nodes)."""
    groups: dict[int, list[Accelerator]] = {}
    for chip in chips:
        if chip.numa_node is not None:
            groups.setdefault(chip.numa_node, []).append(chip)
    for chip in chips:
        group = groups.get(chip.numa_node) if chip.numa_node is not None else None
        if group is not None and len(group) >= need:
            return group[:need]
    return list(chips[:need])
