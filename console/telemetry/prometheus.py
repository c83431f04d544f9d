"""The /metrics body: Prometheus text format 0.0.4 from the Redis latest store.

Chip gauges carry Huawei npu-exporter's names and units (MB, °C, W, %), so its dashboards and
alerts work unchanged; labels are id (NPU id), chip, model_name, node and, where known,
vdie_id and pcie_bus_info. Cost: one MGET plus two small queries, whatever the fleet size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime

from console.inventory.models import Accelerator, Node
from console.telemetry.services import latest_many

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _health(chip: dict) -> int:
    # npu-exporter: 1 when healthy, 0 for anything else (including unknown)
    return 1 if str(chip.get("health") or "").strip().lower() == "ok" else 0


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
    ("npu_chip_info_health_status", "the npu health status, 1 is healthy, 0 otherwise", _health),
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


def _chip_labels(node: str, chip: dict, known: dict) -> str:
    npu, chip_id = chip.get("npu_id"), chip.get("chip_id", 0)
    model, die = known.get((node, npu, chip_id), ("", ""))
    return _labels(
        [
            ("id", npu),
            ("chip", chip_id),
            ("model_name", chip.get("name") or model),
            ("node", node),
            ("vdie_id", die),
            ("pcie_bus_info", chip.get("bus_id")),
        ]
    )


def render_metrics(*, now: datetime | None = None) -> str:
    """Every node's up gauge and, for nodes whose latest values are fresh, every chip gauge.

    Chips of stale or silent nodes are left out (their series end, as when an exporter is
    down); a value the agent did not report is left out, not written as 0.
    """
    names = list(Node.objects.order_by("name").values_list("name", flat=True))
    docs = latest_many(names, now=now)
    known = {
        (node, npu, chip): (model, die)
        for node, npu, chip, model, die in Accelerator.objects.values_list(
            "node__name", "npu_id", "chip_id", "model_name", "die_id"
        )
    }
    chips = [
        (_chip_labels(name, chip, known), chip)
        for name in names
        if (doc := docs[name]) is not None and not doc["stale"]
        for chip in doc.get("chips") or []
    ]
    lines: list[str] = []
    for metric, help_text, getter in CHIP_GAUGES:
        lines += [f"# HELP {metric} {_escape_help(help_text)}", f"# TYPE {metric} gauge"]
        for labels, chip in chips:
            value = getter(chip)
            if value is not None:
                lines.append(f"{metric}{labels} {format_value(value)}")
    metric, help_text = NODE_UP
    lines += [f"# HELP {metric} {_escape_help(help_text)}", f"# TYPE {metric} gauge"]
    for name in names:
        up = docs[name] is not None and not docs[name]["stale"]
        lines.append(f"{metric}{_labels([('node', name)])} {int(up)}")
    from console.diagnosis.incidents import incident_metrics_lines

    lines += incident_metrics_lines()
    lines += refusal_metrics_lines()
    return "\n".join(lines) + "\n"


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
