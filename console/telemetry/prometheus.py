"""The /metrics body: Prometheus text format 0.0.4 from the Redis latest store.

Chip gauges carry Huawei npu-exporter's names, units (MB, °C, W, %) and label names, so its
dashboards and alerts work unchanged: every chip sample has npu-exporter's seven card labels
(id, model_name, vdie_id, pcie_bus_info, namespace, pod_name, container_name; empty when not
known, as npu-exporter writes them) followed by the console's own (node, npu, chip).
`id` is the chip's physical id, as npu-exporter's (its collectCardLabelValue uses PhyId),
when the agent reports one. docs/telemetry.md has the source and the differences.
Cost: one MGET plus three small queries, whatever the fleet size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime

from console.inventory.models import Accelerator, Node
from console.telemetry.services import latest_many

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _health(chip: dict) -> int | None:
    # npu-exporter (collector_for_npu.go getHealthCode): 1 healthy, -1 unknown, 0 otherwise;
    # not reported: no sample
    health = str(chip.get("health") or "").strip().lower()
    if not health:
        return None
    return {"ok": 1, "unknown": -1}.get(health, 0)


CHIP_GAUGES: list[tuple[str, str, Callable[[dict], object]]] = [
    ("npu_chip_info_utilization", "the ai core utilization, unit is '%'",
     lambda c: c.get("aicore_percent")),
    ("npu_chip_info_hbm_used_memory", "the npu hbm used memory, unit is 'MB'",
     lambda c: c.get("hbm_used_mb")),
    ("npu_chip_info_hbm_total_memory", "the npu hbm total memory, unit is 'MB'",
     lambda c: c.get("hbm_total_mb")),
    ("npu_chip_info_used_memory", "the npu used memory, unit is 'MB'",
     lambda c: c.get("memory_used_mb")),
    ("npu_chip_info_total_memory", "the npu total memory, unit is 'MB'",
     lambda c: c.get("memory_total_mb")),
    ("npu_chip_info_temperature", "the npu temperature, unit is 'C'",
     lambda c: c.get("temperature_c")),
    ("npu_chip_info_power", "the npu power, unit is 'W'", lambda c: c.get("power_w")),
    ("npu_chip_info_health_status", "the npu health status, 1 healthy, 0 not, -1 unknown",
     _health),
]  # fmt: skip
NODE_UP = (
    "npu_console_node_up",
    "1 when the node's agent sent a heartbeat within its offline threshold, else 0",
)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float | int | bool) -> str:
    """Integers without a decimal point; NaN and infinities as Prometheus spells them."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _labels(pairs: list[tuple[str, object]]) -> str:
    parts = [f'{k}="{escape_label(str(v))}"' for k, v in pairs if v not in (None, "")]
    return "{" + ",".join(parts) + "}"


# npu-exporter's card labels in its order (mind-cluster component/npu-exporter/collector/
# common/metrics_collector.go CardLabel), then the console's own
NPU_EXPORTER_LABELS = (
    "id",
    "model_name",
    "vdie_id",
    "pcie_bus_info",
    "namespace",
    "pod_name",
    "container_name",
)
CONSOLE_CHIP_LABELS = ("node", "npu", "chip")
HUGEPAGE_GAUGES: list[tuple[str, str, Callable[[dict], object]]] = [
    ("npc_npu_hugepages_used_pages", "the chip's DDR huge pages in use (npu-smi), in pages",
     lambda c: c.get("hugepages_used")),
    ("npc_npu_hugepages_total_pages", "the chip's DDR huge pages (npu-smi), in pages",
     lambda c: c.get("hugepages_total")),
]  # fmt: skip


def _chip_labels(node: str, chip: dict, known: dict) -> str:
    npu, chip_id = chip.get("npu_id"), chip.get("chip_id", 0)
    fact = known.get((node, npu, chip_id), {})
    phy = chip.get("phy_id")
    return _all_labels(
        [
            ("id", npu if phy is None else phy),
            ("model_name", chip.get("name") or fact.get("model") or ""),
            ("vdie_id", fact.get("die") or ""),
            ("pcie_bus_info", chip.get("bus_id") or ""),
            ("namespace", ""),  # no Kubernetes: engines are the console's replicas
            ("pod_name", ""),
            ("container_name", ""),
            ("node", node),
            ("npu", npu),
            ("chip", chip_id),
        ]
    )


def _all_labels(pairs: list[tuple[str, object]]) -> str:
    """Every pair, empty values included (npu-exporter's exposition keeps them)."""
    return "{" + ",".join(f'{k}="{escape_label(str(v))}"' for k, v in pairs) + "}"


def _family(metric: str, help_text: str, samples: list[tuple[str, object]]) -> list[str]:
    lines = [f"# HELP {metric} {_escape_help(help_text)}", f"# TYPE {metric} gauge"]
    return lines + [f"{metric}{labels} {format_value(v)}" for labels, v in samples if v is not None]


def render_metrics(*, now: datetime | None = None) -> str:
    """Every node's up gauge and, for nodes whose latest values are fresh, every chip gauge;
    the inventory's facts (NPUs per node, each NPU's NUMA node and holder, the node's NUMA
    layout) for every node.

    Chips of stale or silent nodes are left out (their series end, as when an exporter is
    down); a value the agent did not report is left out, not written as 0.
    """
    nodes = list(Node.objects.order_by("name").values_list("name", "numa_nodes"))
    names = [name for name, _ in nodes]
    docs = latest_many(names, now=now)
    known = {
        (node, npu, chip): {"model": model, "die": die, "numa": numa}
        for node, npu, chip, model, die, numa in Accelerator.objects.values_list(
            "node__name", "npu_id", "chip_id", "model_name", "die_id", "numa_node"
        )
    }
    chips = [
        (_chip_labels(name, chip, known), chip)
        for name in names
        if (doc := docs[name]) is not None and not doc["stale"]
        for chip in doc.get("chips") or []
    ]
    lines: list[str] = []
    for metric, help_text, getter in CHIP_GAUGES + HUGEPAGE_GAUGES:
        lines += _family(metric, help_text, [(labels, getter(chip)) for labels, chip in chips])
    metric, help_text = NODE_UP
    up = [
        (_labels([("node", n)]), int(docs[n] is not None and not docs[n]["stale"])) for n in names
    ]
    lines += _family(metric, help_text, up)
    lines += inventory_lines(nodes, known)
    from console.diagnosis.incidents import incident_metrics_lines

    lines += incident_metrics_lines()
    lines += refusal_metrics_lines()
    return "\n".join(lines) + "\n"


def inventory_lines(nodes: list[tuple[str, list]], known: dict) -> list[str]:
    """Static facts from the database: NPUs per node (npu-exporter's machine_npu_nums, with a
    node label), each NPU's NUMA node and the replica holding it, each NUMA node's CPUs and
    memory. One query (the allocations) beyond what render_metrics read."""
    per_node: dict[str, int] = {}
    for node, _npu, _chip in known:
        per_node[node] = per_node.get(node, 0) + 1
    lines = _family(
        "machine_npu_nums",
        "Amount of npu installed on the machine (the chips the agent reported).",
        [(_labels([("node", n)]), per_node.get(n, 0)) for n, _ in nodes],
    )
    lines += _family(
        "npc_npu_numa_node",
        "the NUMA node the chip is attached to (sysfs or npu-smi topo)",
        [
            (_labels([("node", n), ("npu", npu), ("chip", c)]), fact["numa"])
            for (n, npu, c), fact in sorted(known.items())
        ],
    )
    lines += _family(
        "npc_npu_replica_info",
        "1 for each chip a replica holds: join on node, npu, chip for the deployment",
        _holders(),
    )
    cpus, memory = [], []
    for name, layout in nodes:
        for entry in layout or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("node"), int):
                continue
            labels = _labels([("node", name), ("numa_node", entry["node"])])
            cpus.append((labels, cpu_count(str(entry.get("cpus") or ""))))
            memory.append((labels, entry.get("memory_mb")))
    lines += _family("npc_node_numa_cpus", "CPUs of the host's NUMA node", cpus)
    lines += _family(
        "npc_node_numa_memory_megabytes", "memory of the host's NUMA node, in MB", memory
    )
    return lines


def _holders() -> list[tuple[str, int]]:
    from console.deployments.models import NpuAllocation

    rows = NpuAllocation.objects.values_list(
        "accelerator__node__name",
        "accelerator__npu_id",
        "accelerator__chip_id",
        "replica__deployment__name",
        "replica__index",
    ).order_by("accelerator__node__name", "accelerator__npu_id", "accelerator__chip_id")
    return [
        (
            _labels([("node", n), ("npu", npu), ("chip", c), ("deployment", d), ("replica", i)]),
            1,
        )
        for n, npu, c, d, i in rows
    ]


def cpu_count(cpulist: str) -> int:
    """CPUs in a kernel CPU list ("0-23,96-119" -> 48); 0 for an empty or unreadable one."""
    total = 0
    for part in filter(None, cpulist.split(",")):
        first, _, last = part.partition("-")
        try:
            total += int(last or first) - int(first) + 1
        except ValueError:
            return 0
    return total


def refusal_metrics_lines() -> list[str]:
    """Inbound messages refused, by reason (console/inventory/inbox.py): a counter kept in
    Redis by every consumer, so it survives console restarts (not Redis restarts)."""
    from console.inventory.inbox import refusal_counts

    try:
        counts = refusal_counts()
    except Exception:  # noqa: BLE001 - Redis down: the series pauses, the page still renders
        return []
    metric = "npc_node_refusals_total"
    lines = [
        f"# HELP {metric} Messages from hosts refused (bad signature, replay, another "
        "node's replica, ...), by reason",
        f"# TYPE {metric} counter",
    ]
    for reason in sorted(counts):
        lines.append(f"{metric}{_labels([('reason', reason)])} {counts[reason]}")
    return lines
