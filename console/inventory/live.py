"""View models of live telemetry for pages: the fleet heatmap and a node's NPU table.

Values come from the hot store (latest heartbeat per node); an NPU whose health is not OK or
whose temperature is at or above HOT_C is flagged with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape as _escape

from django.utils.safestring import mark_safe

HOT_C = 85.0
METRICS = {
    "aicore": ("AICore %", "%"),
    "hbm": ("HBM used %", "%"),
    "temp": ("Temperature °C", "°C"),
    "health": ("Health", ""),
}


@dataclass
class NpuRow:
    npu_id: int
    chip_id: int
    name: str
    health: str
    aicore: float | None
    hbm_used: int | None
    hbm_total: int | None
    hbm_pct: float | None
    temperature: float | None
    power: float | None
    alerts: list[str] = field(default_factory=list)
    processes: list[dict] = field(default_factory=list)
    hugepages_used: int | None = None  # the chip's DDR huge pages (310/310P cards)
    hugepages_total: int | None = None
    holder: object = None  # the replica holding the chip (views.npu_holders), set by the page


def alerts_for(chip: dict) -> list[str]:
    """Why a chip needs attention, in words (empty when it does not)."""
    out = []
    health = chip.get("health") or "UNKNOWN"
    if health != "OK":
        out.append(f"health {health}")
    temp = chip.get("temperature_c")
    if temp is not None and temp >= HOT_C:
        out.append(f"temperature {temp:g} °C ≥ {HOT_C:g} °C")
    return out


def memory_pct(chip: dict) -> tuple[int | None, int | None, float | None]:
    """(used, total, percent) of HBM, or of DDR memory on cards without HBM (310/310P)."""
    used, total = chip.get("hbm_used_mb"), chip.get("hbm_total_mb")
    if not total:
        used, total = chip.get("memory_used_mb"), chip.get("memory_total_mb")
    pct = round(100.0 * used / total, 1) if used is not None and total else None
    return used, total, pct


def _level(value: float | None, lo: float, hi: float) -> int | None:
    if value is None:
        return None
    return max(0, min(4, int((value - lo) / (hi - lo) * 5)))


_CELL_STATE = {"Alarm": "crit", "Critical": "crit", "Warning": "warn", "UNKNOWN": "unknown"}


def cell_html(chip: dict, metric: str) -> str:
    """One chip's heatmap cell: its value for `metric`, a 0..4 level on the sequential scale (none
    without data), a state class (crit: Alarm/Critical health or >= HOT_C; warn: Warning;
    unknown) and a title saying why it needs attention.

    Markup built here in one pass rather than in a template loop or through format_html: a page
    of 50 nodes is 400 cells, and those were most of the dashboard's time. The title and value
    (they hold agent-reported words) are escaped; state and level are ours.
    """
    health = chip.get("health") or "UNKNOWN"
    temp = chip.get("temperature_c")
    hot = temp is not None and temp >= HOT_C
    state = "crit" if hot else _CELL_STATE.get(health, "")
    if metric == "aicore":
        v = chip.get("aicore_percent")
        level = _level(v, 0, 100)
    elif metric == "hbm":
        v = memory_pct(chip)[2]
        level = _level(v, 0, 100)
    elif metric == "temp":
        v, level = temp, _level(temp, 30, HOT_C)
    else:
        v, level = None, (0 if health == "OK" else None)
    text = health[:2] if metric == "health" else ("–" if v is None else f"{v:.0f}")
    alerts = ", ".join(alerts_for(chip)) if hot or health != "OK" else "OK"
    title = f"NPU {chip['npu_id']}.{chip.get('chip_id', 0)} {chip.get('name') or ''}: {alerts}"
    cls = f"heatmap-cell heatmap-cell--{state}" if state else "heatmap-cell"
    lvl = "" if level is None else f' data-level="{level:d}"'
    return f'<span class="{cls}"{lvl} title="{_escape(title)}">{_escape(text)}</span>'


def heatmap(nodes: list, latest: dict[str, dict | None], metric: str) -> list[dict]:
    """One row per node (dicts with name, status, simulated): the node, `chips` (how many
    reported), `cells_html` (their cells' markup), `no_data` (no live values) and the telemetry
    degradation reason if any."""
    rows = []
    for node in nodes:
        data = latest.get(node["name"]) or {}
        chips = data.get("chips") or []
        rows.append(
            {
                "node": node,
                "chips": len(chips),
                "cells_html": mark_safe("".join([cell_html(c, metric) for c in chips])),  # noqa: S308
                "no_data": not data,
                "telemetry_reason": data.get("telemetry_reason"),
            }
        )
    return rows


def node_summary(chips: list[dict]) -> list:
    """What the fleet totals need from one node's chips, small enough to keep per node in
    the hot store: [chips, memory used MB, memory total MB, AICore sum, AICore count, chips
    needing attention]."""
    used = total = aicore_n = alerts = 0
    aicore = 0.0
    for c in chips:
        u, t, _ = memory_pct(c)
        used, total = used + (u or 0), total + (t or 0)
        if c.get("aicore_percent") is not None:
            aicore, aicore_n = aicore + c["aicore_percent"], aicore_n + 1
        alerts += 1 if alerts_for(c) else 0
    return [len(chips), used, total, aicore, aicore_n, alerts]


def totals_of(sums: list) -> dict:
    """Fleet-wide live totals (chips reporting, HBM, mean AICore, alerts) from the sum of the
    node summaries (telemetry.services.fleet_totals)."""
    chips, used, total, aicore, aicore_n, alerts = sums
    return {
        "chips": chips,
        "hbm_used_gb": round(used / 1024, 1),
        "hbm_total_gb": round(total / 1024, 1),
        "hbm_pct": round(100 * used / total, 1) if total else None,
        "aicore_mean": round(aicore / aicore_n, 1) if aicore_n else None,
        "alerts": alerts,
    }


def npu_rows(data: dict | None) -> list[NpuRow]:
    """A node's chips from its latest heartbeat, with processes attached to their chip."""
    if not data:
        return []
    procs: dict[tuple[int, int], list[dict]] = {}
    for p in data.get("processes") or []:
        procs.setdefault((p["npu_id"], p.get("chip_id") or 0), []).append(p)
    rows = []
    for c in data.get("chips") or []:
        used, total, pct = memory_pct(c)
        rows.append(
            NpuRow(
                npu_id=c["npu_id"],
                chip_id=c.get("chip_id", 0),
                name=c.get("name") or "",
                health=c.get("health") or "UNKNOWN",
                aicore=c.get("aicore_percent"),
                hbm_used=used,
                hbm_total=total,
                hbm_pct=pct,
                temperature=c.get("temperature_c"),
                power=c.get("power_w"),
                alerts=alerts_for(c),
                processes=procs.get((c["npu_id"], c.get("chip_id", 0)), []),
                hugepages_used=c.get("hugepages_used"),
                hugepages_total=c.get("hugepages_total"),
            )
        )
    return rows


CHART_BUCKET_S = 30
CHART_METRICS = (
    ("AICore %", "aicore_percent", "%"),
    ("HBM used %", "hbm_pct", "%"),
    ("Temperature °C", "temperature_c", "°C"),
)


def node_charts(node_id: int, *, minutes: int = 60, now=None) -> list[dict]:
    """The node's last hour as one chart per metric with one series per chip.

    One query over raw samples, averaged into CHART_BUCKET_S buckets in Python, so the page
    costs the same whatever the number of chips. Returns [] when there is nothing to draw.
    """
    import json
    from datetime import timedelta

    from django.utils import timezone

    from console.telemetry.models import ChipSample

    now = now or timezone.now()
    rows = ChipSample.objects.filter(
        node_id=node_id, time__gte=now - timedelta(minutes=minutes)
    ).values_list(
        "npu_id",
        "chip_id",
        "time",
        "aicore_percent",
        "hbm_used_mb",
        "hbm_total_mb",
        "temperature_c",
    )
    buckets: dict[tuple[int, int], dict[int, list[list[float]]]] = {}
    for npu, chip, t, aicore, used, total, temp in rows.iterator():
        slot = int(t.timestamp()) // CHART_BUCKET_S * CHART_BUCKET_S
        acc = buckets.setdefault((npu, chip), {}).setdefault(slot, [[], [], []])
        for i, v in enumerate(
            (aicore, 100.0 * used / total if used is not None and total else None, temp)
        ):
            if v is not None:
                acc[i].append(v)
    if not buckets:
        return []
    xs = sorted({slot for per_chip in buckets.values() for slot in per_chip})
    charts = []
    for index, (title, _, unit) in enumerate(CHART_METRICS):
        series = []
        for (npu, chip), per_chip in sorted(buckets.items()):
            values = []
            for x in xs:
                vals = per_chip.get(x, [[], [], []])[index]
                values.append(round(sum(vals) / len(vals), 1) if vals else None)
            series.append({"label": f"NPU {npu}.{chip}", "values": values})
        charts.append(
            {"title": title, "json": json.dumps({"x": xs, "series": series, "yLabel": unit})}
        )
    return charts
