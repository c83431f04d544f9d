"""Reading stored telemetry as time series: for the API (`query_series`) and for page charts
(`chart_series`). Read-only; the newest few seconds are still in the Redis buffer, not here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from console.errors import Invalid
from console.inventory.models import Accelerator
from console.inventory.services import get_node
from console.telemetry.models import HEALTH_LABELS, ChipRollup, ChipSample, Resolution
from console.telemetry.rollups import minute_retention, raw_retention

RESOLUTIONS = ("raw", "1m", "1h", "auto")
ROLLUP_SECONDS = {"1m": int(Resolution.MINUTE), "1h": int(Resolution.HOUR)}
AUTO_RAW_UP_TO = timedelta(hours=2)
AUTO_MINUTES_UP_TO = timedelta(days=3)
DEFAULT_RANGE = timedelta(hours=1)
MAX_POINTS = 5_000  # per chip series; the newest points are kept

# One row shape for every resolution: averages under the plain names, maxima beside them.
COLUMNS = (
    "time",
    "aicore_percent",
    "aicore_percent_max",
    "hbm_used_mb",
    "hbm_used_mb_max",
    "hbm_total_mb",
    "temperature_c",
    "temperature_c_max",
    "power_w",
    "health",
    "samples",
)
RAW_FIELDS = (
    "time",
    "aicore_percent",
    "hbm_used_mb",
    "hbm_total_mb",
    "temperature_c",
    "power_w",
    "health",
)
ROLLUP_FIELDS = (
    "bucket",
    "aicore_avg",
    "aicore_max",
    "hbm_used_avg",
    "hbm_used_max",
    "hbm_total_mb",
    "temperature_avg",
    "temperature_max",
    "power_avg",
    "health_worst",
    "samples",
)


def pick_resolution(start: datetime, end: datetime, *, now: datetime | None = None) -> str:
    """`auto`: raw up to 2 hours, 1-minute buckets up to 3 days, else 1-hour buckets — each
    only while `start` is within that resolution's retention (as of `now`), so a window from
    last week gets the hourly buckets that still hold it, not purged minutes."""
    span, now = end - start, now or timezone.now()
    if span <= AUTO_RAW_UP_TO and start >= now - raw_retention():
        return "raw"
    if span <= AUTO_MINUTES_UP_TO and start >= now - minute_retention():
        return "1m"
    return "1h"


def chip_rows(
    node_id: int, npu_id: int, chip_id: int, start: datetime, end: datetime, resolution: str
) -> tuple[list[tuple], bool]:
    """One chip's rows in COLUMNS order, oldest first, start <= time <= end; at most
    MAX_POINTS (the newest), and whether older ones were left out."""
    chip = {"node_id": node_id, "npu_id": npu_id, "chip_id": chip_id}
    if resolution == "raw":
        qs = ChipSample.objects.filter(**chip, time__gte=start, time__lte=end)
        rows = [
            _raw_row(r) for r in qs.order_by("-time").values_list(*RAW_FIELDS)[: MAX_POINTS + 1]
        ]
    else:
        qs = ChipRollup.objects.filter(
            **chip, resolution=ROLLUP_SECONDS[resolution], bucket__gte=start, bucket__lte=end
        )
        rows = list(qs.order_by("-bucket").values_list(*ROLLUP_FIELDS)[: MAX_POINTS + 1])
    truncated = len(rows) > MAX_POINTS
    return rows[:MAX_POINTS][::-1], truncated


def _raw_row(r: tuple) -> tuple:
    time, aicore, hbm_used, hbm_total, temp, power, health = r
    return (time, aicore, aicore, hbm_used, hbm_used, hbm_total, temp, temp, power, health, 1)


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and timezone.is_naive(value):
        return value.replace(tzinfo=UTC)
    return value


def _chips(node_id: int, npu_id: int | None, chip_id: int | None) -> list[tuple[int, int]]:
    qs = Accelerator.objects.filter(node_id=node_id)
    if npu_id is not None:
        qs = qs.filter(npu_id=npu_id)
    if chip_id is not None:
        qs = qs.filter(chip_id=chip_id)
    chips = list(qs.order_by("npu_id", "chip_id").values_list("npu_id", "chip_id"))
    if not chips and npu_id is not None:  # history of a chip no longer in the inventory
        chips = [(npu_id, chip_id or 0)]
    return chips


def query_series(
    *,
    node: str,
    npu_id: int | None = None,
    chip_id: int | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    resolution: str = "auto",
    now: datetime | None = None,
) -> dict:
    """Series for a node's chips (all, or those matching npu_id/chip_id) over [start, end].

    Defaults: end = now, start = end - 1 hour; naive datetimes are UTC. Raises NotFound for
    an unknown node, Invalid naming `start` when start > end and `resolution` when unknown.
    Each series holds column lists (COLUMNS); `truncated` says some had over MAX_POINTS.
    """
    if resolution not in RESOLUTIONS:
        raise Invalid(f"resolution must be one of {', '.join(RESOLUTIONS)}", field="resolution")
    node_obj = get_node(node)
    end = _aware(end) or now or timezone.now()
    start = _aware(start) or end - DEFAULT_RANGE
    if start > end:
        raise Invalid("start must not be after end", field="start")
    chosen = pick_resolution(start, end, now=now) if resolution == "auto" else resolution
    series, truncated = [], False
    for npu, chip in _chips(node_obj.pk, npu_id, chip_id):
        rows, cut = chip_rows(node_obj.pk, npu, chip, start, end, chosen)
        truncated |= cut
        series.append({"npu_id": npu, "chip_id": chip, **_columns(rows)})
    step = ROLLUP_SECONDS.get(chosen, settings.HEARTBEAT_INTERVAL_S)
    return {
        "node": node_obj.name,
        "resolution": chosen,
        "step_s": step,
        "start": start,
        "end": end,
        "truncated": truncated,
        "series": series,
    }


def _columns(rows: list[tuple]) -> dict[str, list]:
    cols = {name: [] for name in COLUMNS}
    for row in rows:
        for name, value in zip(COLUMNS, row, strict=True):
            cols[name].append(value)
    cols["time"] = [t.timestamp() for t in cols["time"]]
    cols["health"] = [HEALTH_LABELS.get(h) if h is not None else None for h in cols["health"]]
    for name in ("aicore_percent", "hbm_used_mb", "temperature_c", "power_w"):
        cols[name] = [round(v, 3) if isinstance(v, float) else v for v in cols[name]]
    return cols


def chart_series(
    node_id: int, npu_id: int, chip_id: int = 0, minutes: int = 60, *, now: datetime | None = None
) -> dict:
    """One chip's last `minutes` for the page chart helper (static/js/console.js, npuChart):
    {"x": [unix s], "series": [{"label", "values"}: AICore %, HBM %, Temp °C], "yLabel": "%"}.

    Resolution as for `auto`; at most MAX_POINTS points; values may be None (gaps).
    """
    end = now or timezone.now()
    start = end - timedelta(minutes=minutes)
    chosen = pick_resolution(start, end, now=end)
    rows, _ = chip_rows(node_id, npu_id, chip_id, start, end, chosen)
    hbm = [round(100 * r[3] / r[5], 1) if r[3] is not None and r[5] else None for r in rows]
    return {
        "x": [int(r[0].timestamp()) for r in rows],
        "series": [
            {"label": "AICore %", "values": [_round(r[1]) for r in rows]},
            {"label": "HBM %", "values": hbm},
            {"label": "Temp °C", "values": [_round(r[6]) for r in rows]},
        ],
        "yLabel": "%",
    }


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None
