"""Rollups (exact aggregates across minute and hour boundaries, idempotent) and retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.telemetry.models import ChipRollup, ChipSample, HealthCode, Resolution
from console.telemetry.rollups import floor_to, purge_telemetry, roll_up
from tests.console.telemetry.builders import rollup, sample
from tests.factories import make_node

H10 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)
S = timedelta(seconds=1)
M = timedelta(minutes=1)


def rows(resolution: int, npu_id: int = 0) -> dict:
    qs = ChipRollup.objects.filter(resolution=resolution, npu_id=npu_id).order_by("bucket")
    return {r.bucket: r for r in qs}


@pytest.fixture
def hand_made(db):
    """Samples of one chip: three in 10:00, one at 10:01:00, one at 10:59:30, one in hour 11;
    and one sample of another chip (npu 1) in 10:00 that must not mix in."""
    node = make_node("kp-01")
    for at, a, hbm, temp, power, health in [
        (H10 + 5 * S, 10.0, 1000, 40.0, 100.0, HealthCode.OK),
        (H10 + 35 * S, 30.0, 3000, 50.0, 200.0, HealthCode.WARNING),
        (H10 + timedelta(seconds=59, microseconds=999_000), 20.0, 2000, 45.0, 150.0, HealthCode.OK),
        (H10 + M, 80.0, 8000, 60.0, 300.0, HealthCode.OK),
        (H10 + 59 * M + 30 * S, 5.0, 500, 35.0, 90.0, HealthCode.CRITICAL),
        (H10 + 60 * M + 10 * S, 99.0, 9900, 70.0, 400.0, None),
    ]:
        sample(node, at, aicore_percent=a, hbm_used_mb=hbm, temperature_c=temp, power_w=power,
               health=health)  # fmt: skip
    sample(node, H10 + 6 * S, npu_id=1, aicore_percent=100.0)
    return node


def test_minute_rollups_are_exact_and_split_at_the_minute(hand_made):
    assert roll_up(now=H10 + 62 * M) == {"1m": 5, "1h": 2}
    minutes = rows(Resolution.MINUTE)
    assert list(minutes) == [H10, H10 + M, H10 + 59 * M, H10 + 60 * M]
    m0 = minutes[H10]
    assert (m0.samples, m0.aicore_avg, m0.aicore_max) == (3, 20.0, 30.0)
    assert (m0.hbm_used_avg, m0.hbm_used_max, m0.hbm_total_mb) == (2000.0, 3000, 65_536)
    assert (m0.temperature_avg, m0.temperature_max, m0.power_avg) == (45.0, 50.0, 150.0)
    assert m0.health_worst == HealthCode.WARNING
    assert (minutes[H10 + M].samples, minutes[H10 + M].aicore_avg) == (1, 80.0)
    assert minutes[H10 + 60 * M].health_worst is None  # health not reported
    other = ChipRollup.objects.get(resolution=Resolution.MINUTE, npu_id=1)
    assert (other.bucket, other.aicore_avg, other.samples) == (H10, 100.0, 1)


def test_hour_rollups_weight_minutes_by_their_samples(hand_made):
    roll_up(now=H10 + 62 * M)
    (hour,) = rows(Resolution.HOUR).values()
    assert hour.bucket == H10 and hour.samples == 5
    assert hour.aicore_avg == pytest.approx((10 + 30 + 20 + 80 + 5) / 5)
    assert hour.aicore_max == 80.0
    assert hour.hbm_used_avg == pytest.approx((1000 + 3000 + 2000 + 8000 + 500) / 5)
    assert hour.hbm_used_max == 8000
    assert hour.temperature_avg == pytest.approx((40 + 50 + 45 + 60 + 35) / 5)
    assert hour.temperature_max == 60.0
    assert hour.power_avg == pytest.approx((100 + 200 + 150 + 300 + 90) / 5)
    assert hour.health_worst == HealthCode.CRITICAL


def test_only_completed_buckets_are_rolled_up(hand_made):
    roll_up(now=H10 + 60 * M + 59 * S)  # 10:59 ended, but less than the grace ago
    assert max(rows(Resolution.MINUTE)) == H10 + M
    assert rows(Resolution.HOUR) == {}  # so hour 10 is not complete either
    roll_up(now=H10 + 61 * M)
    assert max(rows(Resolution.MINUTE)) == H10 + 59 * M
    assert list(rows(Resolution.HOUR)) == [H10]


def test_rerunning_writes_nothing_new_and_later_runs_continue(hand_made):
    roll_up(now=H10 + 62 * M)
    before = list(ChipRollup.objects.order_by("id").values())
    assert roll_up(now=H10 + 62 * M) == {"1m": 0, "1h": 0}
    assert list(ChipRollup.objects.order_by("id").values()) == before
    assert roll_up(now=H10 + 125 * M) == {"1m": 0, "1h": 1}  # hour 11 completes
    hour11 = ChipRollup.objects.get(resolution=Resolution.HOUR, bucket=H10 + 60 * M)
    assert (hour11.samples, hour11.aicore_avg) == (1, 99.0)


def test_recomputing_a_range_upserts_instead_of_duplicating(hand_made):
    roll_up(now=H10 + 62 * M)
    count = ChipRollup.objects.count()
    ChipRollup.objects.filter(bucket=H10).update(aicore_avg=-1.0)  # damaged
    sample(hand_made, H10 + 40 * S, aicore_percent=60.0)  # a late sample
    assert roll_up(now=H10 + 62 * M, since=H10)["1m"] == 5
    assert ChipRollup.objects.count() == count
    m0 = ChipRollup.objects.get(resolution=Resolution.MINUTE, bucket=H10, npu_id=0)
    assert (m0.samples, m0.aicore_avg, m0.aicore_max) == (4, 30.0, 60.0)
    h = ChipRollup.objects.get(resolution=Resolution.HOUR, bucket=H10, npu_id=0)
    assert (h.samples, h.aicore_avg) == (6, pytest.approx(205 / 6))


def test_a_long_gap_without_samples_is_skipped(db):
    node = make_node("kp-01")
    sample(node, H10)
    roll_up(now=H10 + 2 * M)
    later = H10 + timedelta(days=3)
    sample(node, later + 10 * S, aicore_percent=42.0)
    assert roll_up(now=later + 2 * M)["1m"] == 1
    assert max(rows(Resolution.MINUTE)) == later


def test_floor_to_aligns_on_utc_buckets():
    t = datetime(2026, 1, 5, 10, 59, 59, 999_999, tzinfo=UTC)
    assert floor_to(t, M) == datetime(2026, 1, 5, 10, 59, tzinfo=UTC)
    assert floor_to(t, timedelta(hours=1)) == H10


# --- retention ------------------------------------------------------------------------------
def test_purge_keeps_what_is_inside_the_windows(db, settings):
    settings.TELEMETRY_RAW_RETENTION_H = 24
    settings.TELEMETRY_ROLLUP_RETENTION_D = 30
    settings.TELEMETRY_MINUTE_RETENTION_D = 30
    node = make_node("kp-01")
    now = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    raw_cut, rollup_cut = now - timedelta(hours=24), now - timedelta(days=30)
    for at in (raw_cut - timedelta(hours=3), raw_cut - S, raw_cut, raw_cut + S, now):
        sample(node, at)
    for res in Resolution:
        for at in (rollup_cut - timedelta(days=2), rollup_cut - M, rollup_cut, now - M):
            rollup(node, res, at)
    assert purge_telemetry(now=now) == {"raw": 2, "1m": 2, "1h": 2}
    assert sorted(ChipSample.objects.values_list("time", flat=True)) == [raw_cut, raw_cut + S, now]
    for res in Resolution:
        kept = ChipRollup.objects.filter(resolution=res).values_list("bucket", flat=True)
        assert sorted(kept) == [rollup_cut, now - M]
    assert purge_telemetry(now=now) == {"raw": 0, "1m": 0, "1h": 0}


def test_purge_keeps_raw_samples_not_yet_rolled_up(db, settings):
    settings.TELEMETRY_RAW_RETENTION_H = 24
    node = make_node("kp-01")
    now = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
    rolled_until = now - timedelta(hours=30)
    rollup(node, Resolution.MINUTE, rolled_until - M)
    sample(node, rolled_until - S)
    sample(node, rolled_until + S)  # past retention, but its minute has no rollup yet
    assert purge_telemetry(now=now)["raw"] == 1
    assert list(ChipSample.objects.values_list("time", flat=True)) == [rolled_until + S]


def test_minutes_are_kept_for_their_own_shorter_window_but_never_before_their_hour(db, settings):
    settings.TELEMETRY_ROLLUP_RETENTION_D, settings.TELEMETRY_MINUTE_RETENTION_D = 30, 7
    node = make_node("kp-01")
    now = datetime(2026, 1, 20, 12, 0, tzinfo=UTC)
    minute_cut = now - timedelta(days=7)
    for at in (minute_cut - timedelta(days=1), minute_cut - M, minute_cut, now - M):
        rollup(node, Resolution.MINUTE, at)
    rollup(node, Resolution.HOUR, now - timedelta(days=20))
    rollup(node, Resolution.HOUR, minute_cut - timedelta(hours=2))  # hours rolled until here
    # the day-old minute is in a rolled hour; minute_cut - 1 min is not rolled yet: kept
    assert purge_telemetry(now=now) == {"raw": 0, "1m": 1, "1h": 0}
    rollup(node, Resolution.HOUR, now - timedelta(hours=2))
    assert purge_telemetry(now=now) == {"raw": 0, "1m": 1, "1h": 0}
    minutes = ChipRollup.objects.filter(resolution=Resolution.MINUTE)
    assert sorted(minutes.values_list("bucket", flat=True)) == [minute_cut, now - M]
    assert ChipRollup.objects.filter(resolution=Resolution.HOUR).count() == 3


def test_minutes_are_never_kept_longer_than_hours(db, settings):
    settings.TELEMETRY_ROLLUP_RETENTION_D, settings.TELEMETRY_MINUTE_RETENTION_D = 5, 7
    node = make_node("kp-01")
    now = datetime(2026, 1, 20, 12, 0, tzinfo=UTC)
    rollup(node, Resolution.MINUTE, now - timedelta(days=6))
    rollup(node, Resolution.HOUR, now - timedelta(hours=2))
    assert purge_telemetry(now=now)["1m"] == 1
