"""Rollups (raw -> 1-minute -> 1-hour buckets) and retention. Database only, no Redis.

Both take `now` so tests control time. Rollups are upserts on a unique key, so any re-run —
a retried task, two workers at once — rewrites the same rows instead of adding new ones.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Avg, Case, Count, F, FloatField, Max, QuerySet, Sum, When
from django.db.models.functions import TruncHour, TruncMinute

from console.telemetry.models import ChipRollup, ChipSample, Resolution

GRACE = timedelta(seconds=60)  # a minute is complete this long after it ends (flush lag)
MAX_MINUTES_PER_RUN = 240  # catching up after downtime happens over several runs
MAX_HOURS_PER_RUN = 48
MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
RAW_DELETE_STEP = timedelta(minutes=10)  # keeps each DELETE's transaction short
ROLLUP_DELETE_STEP = timedelta(hours=6)
CHIP_KEY = ("node_id", "npu_id", "chip_id")
AGGREGATES = [
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
]
WEIGHTED = {"aicore_avg", "hbm_used_avg", "temperature_avg", "power_avg"}


def floor_to(t: datetime, step: timedelta) -> datetime:
    """The start of the `step`-long bucket holding `t` (buckets aligned on the Unix epoch)."""
    seconds = int(step.total_seconds())
    return datetime.fromtimestamp(int(t.timestamp()) // seconds * seconds, tz=UTC)


def roll_up(*, now: datetime, since: datetime | None = None) -> dict[str, int]:
    """Build 1-minute rollups for completed minutes, then 1-hour ones for completed hours.

    A minute is complete GRACE after it ends; an hour once all its minutes are rolled up.
    Work resumes after the newest bucket already stored (gaps without samples are skipped),
    at most MAX_MINUTES_PER_RUN / MAX_HOURS_PER_RUN per call; `since` recomputes from that
    time instead (repairs, late samples). Idempotent. Returns rollup rows written per
    resolution.
    """
    minutes, frontier = _roll_minutes(floor_to(now - GRACE, MINUTE), since)
    hours = _roll_hours(floor_to(frontier, HOUR), since)
    return {"1m": minutes, "1h": hours}


def _next_start(
    resolution: int, source: QuerySet, field: str, step: timedelta, since: datetime | None
) -> datetime | None:
    """Where to resume: the first source row after the newest stored bucket (or at/after
    `since`), floored to the bucket."""
    if since is not None:
        source = source.filter(**{f"{field}__gte": floor_to(since, step)})
    else:
        newest = ChipRollup.objects.filter(resolution=resolution).aggregate(m=Max("bucket"))
        if newest["m"] is not None:
            source = source.filter(**{f"{field}__gte": newest["m"] + step})
    first = source.order_by(field).values_list(field, flat=True).first()
    return floor_to(first, step) if first is not None else None


def _roll_minutes(end: datetime, since: datetime | None) -> tuple[int, datetime]:
    """Roll minutes before `end`; returns rows written and the end of what is done."""
    start = _next_start(Resolution.MINUTE, ChipSample.objects.all(), "time", MINUTE, since)
    if start is None or start >= end:
        return 0, end
    stop = min(end, start + MAX_MINUTES_PER_RUN * MINUTE)
    written = 0
    for a in _steps(start, stop, 15 * MINUTE):
        rows = (
            ChipSample.objects.filter(time__gte=a, time__lt=min(a + 15 * MINUTE, stop))
            .annotate(b=TruncMinute("time"))
            .values(*CHIP_KEY, "b")
            .annotate(
                aicore_avg=Avg("aicore_percent"),
                aicore_max=Max("aicore_percent"),
                hbm_used_avg=Avg("hbm_used_mb"),
                hbm_used_max=Max("hbm_used_mb"),
                hbm_total=Max("hbm_total_mb"),
                temperature_avg=Avg("temperature_c"),
                temperature_max=Max("temperature_c"),
                power_avg=Avg("power_w"),
                health_worst=Max("health"),
                samples=Count("id"),
            )
            .order_by(*CHIP_KEY, "b")  # one lock order for concurrent upserts
        )
        written += _upsert(Resolution.MINUTE, [dict(r, hbm_total_mb=r["hbm_total"]) for r in rows])
    return written, stop


def _weighted(field: str) -> dict:
    """Sum(avg × samples) and the samples behind non-null averages: an exact mean of means."""
    return {
        f"{field}_w": Sum(F(field) * F("samples"), output_field=FloatField()),
        f"{field}_n": Sum(Case(When(**{f"{field}__isnull": False}, then=F("samples")))),
    }


def _roll_hours(end: datetime, since: datetime | None) -> int:
    minutes = ChipRollup.objects.filter(resolution=Resolution.MINUTE)
    start = _next_start(Resolution.HOUR, minutes, "bucket", HOUR, since)
    if start is None or start >= end:
        return 0
    stop = min(end, start + MAX_HOURS_PER_RUN * HOUR)
    written = 0
    for a in _steps(start, stop, 6 * HOUR):
        rows = (
            minutes.filter(bucket__gte=a, bucket__lt=min(a + 6 * HOUR, stop))
            .annotate(b=TruncHour("bucket"))
            .values(*CHIP_KEY, "b")
            .annotate(
                **{k: v for f in sorted(WEIGHTED) for k, v in _weighted(f).items()},
                aicore_mx=Max("aicore_max"),
                hbm_used_mx=Max("hbm_used_max"),
                hbm_total=Max("hbm_total_mb"),
                temperature_mx=Max("temperature_max"),
                health=Max("health_worst"),
                n=Sum("samples"),
            )
            .order_by(*CHIP_KEY, "b")
        )
        written += _upsert(Resolution.HOUR, [_hour_row(r) for r in rows])
    return written


def _hour_row(r: dict) -> dict:
    row = {k: r[k] for k in (*CHIP_KEY, "b")}
    for field in WEIGHTED:
        n = r[f"{field}_n"]
        row[field] = r[f"{field}_w"] / n if n else None
    row.update(
        aicore_max=r["aicore_mx"],
        hbm_used_max=r["hbm_used_mx"],
        hbm_total_mb=r["hbm_total"],
        temperature_max=r["temperature_mx"],
        health_worst=r["health"],
        samples=r["n"],
    )
    return row


def _upsert(resolution: int, rows: list[dict]) -> int:
    objs = [
        ChipRollup(
            resolution=resolution, bucket=r["b"], **{k: r[k] for k in (*CHIP_KEY, *AGGREGATES)}
        )
        for r in rows
    ]
    ChipRollup.objects.bulk_create(
        objs,
        batch_size=500,
        update_conflicts=True,
        unique_fields=["node", "npu_id", "chip_id", "resolution", "bucket"],
        update_fields=AGGREGATES,
    )
    return len(objs)


def _steps(start: datetime, stop: datetime, step: timedelta):
    while start < stop:
        yield start
        start += step


# --- retention ------------------------------------------------------------------------------
def raw_retention() -> timedelta:
    return timedelta(hours=settings.TELEMETRY_RAW_RETENTION_H)


def minute_retention() -> timedelta:
    """How long 1-minute rollups are kept: TELEMETRY_MINUTE_RETENTION_D days, never longer
    than the hourly ones."""
    days = min(settings.TELEMETRY_MINUTE_RETENTION_D, settings.TELEMETRY_ROLLUP_RETENTION_D)
    return timedelta(days=days)


def purge_telemetry(*, now: datetime) -> dict[str, int]:
    """Delete raw samples older than TELEMETRY_RAW_RETENTION_H hours, 1-minute rollups older
    than `minute_retention()` and 1-hour rollups older than TELEMETRY_ROLLUP_RETENTION_D days;
    returns rows deleted per kind.

    What the next resolution up is computed from is kept past its retention until it has been
    rolled up (once any row of that resolution exists): raw samples until their minute is,
    minutes until their hour is, so a stalled rollup loses no history. Deletes go in time
    slices, oldest first, each its own short transaction. Idempotent.
    """
    minutes = ChipRollup.objects.filter(resolution=Resolution.MINUTE)
    hours = ChipRollup.objects.filter(resolution=Resolution.HOUR)
    raw_cutoff = _not_after_rolled(now - raw_retention(), minutes, MINUTE)
    minute_cutoff = _not_after_rolled(now - minute_retention(), hours, HOUR)
    rollup_cutoff = now - timedelta(days=settings.TELEMETRY_ROLLUP_RETENTION_D)
    return {
        "raw": _delete_before(ChipSample.objects.all(), "time", raw_cutoff, RAW_DELETE_STEP),
        "1m": _delete_before(minutes, "bucket", minute_cutoff, ROLLUP_DELETE_STEP),
        "1h": _delete_before(hours, "bucket", rollup_cutoff, ROLLUP_DELETE_STEP),
    }


def _not_after_rolled(cutoff: datetime, rolled: QuerySet, step: timedelta) -> datetime:
    """`cutoff`, or the end of the newest bucket in `rolled` when that is earlier."""
    newest = rolled.aggregate(m=Max("bucket"))["m"]
    return cutoff if newest is None else min(cutoff, newest + step)


def _delete_before(qs: QuerySet, field: str, cutoff: datetime, step: timedelta) -> int:
    deleted = 0
    while True:
        oldest = qs.filter(**{f"{field}__lt": cutoff}).order_by(field)
        oldest = oldest.values_list(field, flat=True).first()
        if oldest is None:
            return deleted
        count, _ = qs.filter(**{f"{field}__lt": min(cutoff, oldest + step)}).delete()
        deleted += count
