"""Telemetry API: latest values from Redis, stored series at the right resolution, bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from console.telemetry import series, services
from console.telemetry.models import ChipRollup, ChipSample, Resolution
from tests.console.telemetry.builders import chip, heartbeat, sample
from tests.factories import make_node

# recent: `auto` picks a resolution only while the window is within its retention
END = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1)


def test_latest_answers_the_last_beat_with_a_stale_flag(viewer_client, hot):
    node = make_node("kp-01", npus=2)
    url = "/api/v1/nodes/kp-01/telemetry/latest"
    body = viewer_client.get(url).json()
    assert body == {
        "node": "kp-01", "received_at": None, "sent_at": None, "age_s": None, "stale": True,
        "telemetry_ok": None, "telemetry_reason": None, "chips": [], "processes": [],
    }  # fmt: skip
    now = timezone.now()
    hb = heartbeat("kp-01", [chip(0), chip(1, health="Critical")], sent_at=now)
    services.record_heartbeat(node_id=node.pk, node_name="kp-01", received_at=now, hb=hb)
    body = viewer_client.get(url).json()
    assert body["stale"] is False and body["age_s"] < 5
    assert [(c["npu_id"], c["health"]) for c in body["chips"]] == [(0, "OK"), (1, "Critical")]
    assert body["chips"][0]["hbm_used_mb"] == 32_768 and body["processes"][0]["name"] == "vllm"

    old = now - timedelta(seconds=16)
    services.record_heartbeat(node_id=node.pk, node_name="kp-01", received_at=old, hb=hb)
    assert viewer_client.get(url).json()["stale"] is True


def test_latest_of_an_unknown_node_is_404(viewer_client, hot):
    resp = viewer_client.get("/api/v1/nodes/nope/telemetry/latest")
    assert resp.status_code == 404
    assert resp.json()["field"] == "name"


@pytest.fixture
def history(db):
    """kp-01 npu 0: raw every 5 s over the last 10 minutes, 1m buckets over 3 days,
    1h buckets over 10 days; npu 1: one raw sample."""
    node = make_node("kp-01", npus=2)
    ChipSample.objects.bulk_create(
        ChipSample(node=node, npu_id=0, time=END - timedelta(seconds=5 * i),
                   aicore_percent=float(i), hbm_total_mb=65_536, health=0)
        for i in range(120)
    )  # fmt: skip
    ChipRollup.objects.bulk_create(
        [
            *(minute(node, END - timedelta(minutes=i + 1)) for i in range(0, 3 * 24 * 60, 30)),
            *(hour(node, END - timedelta(hours=i + 1)) for i in range(10 * 24)),
        ]
    )
    sample(node, END, npu_id=1, aicore_percent=77.0, health=2)
    return node


def minute(node, bucket):
    return ChipRollup(node=node, resolution=Resolution.MINUTE, bucket=bucket, npu_id=0,
                      aicore_avg=1.0, samples=12)  # fmt: skip


def hour(node, bucket):
    return ChipRollup(node=node, resolution=Resolution.HOUR, bucket=bucket, npu_id=0,
                      aicore_avg=2.0, samples=12)  # fmt: skip


def get(client, **params):
    params = {"node": "kp-01", "end": END.isoformat(), **params}
    return client.get("/api/v1/telemetry", params)


@pytest.mark.parametrize(
    "span, expected, step",
    [
        (timedelta(minutes=5), "raw", 5),
        (timedelta(hours=2), "raw", 5),
        (timedelta(hours=2, seconds=1), "1m", 60),
        (timedelta(days=3), "1m", 60),
        (timedelta(days=7), "1h", 3600),
    ],
)
def test_auto_resolution_follows_the_range(viewer_client, history, span, expected, step):
    body = get(viewer_client, npu_id=0, start=(END - span).isoformat()).json()
    assert (body["resolution"], body["step_s"]) == (expected, step)
    (chip0,) = body["series"]
    assert chip0["time"] == sorted(chip0["time"]) and chip0["time"][-1] <= END.timestamp()
    assert chip0["time"][0] >= (END - span).timestamp()
    if expected != "raw":
        assert set(chip0["aicore_percent"]) == {1.0 if expected == "1m" else 2.0}


@pytest.mark.parametrize(
    "ago, span, expected",
    [
        (timedelta(hours=23), timedelta(hours=1), "raw"),
        (timedelta(hours=30), timedelta(hours=1), "1m"),  # raw is kept 24 h
        (timedelta(days=6), timedelta(days=1), "1m"),
        (timedelta(days=10), timedelta(hours=1), "1h"),  # minutes are kept 7 days
    ],
)
def test_auto_resolution_picks_one_still_kept_for_the_window(
    viewer_client, history, settings, ago, span, expected
):
    settings.TELEMETRY_RAW_RETENTION_H, settings.TELEMETRY_MINUTE_RETENTION_D = 24, 7
    end = timezone.now() - ago + span
    body = get(viewer_client, start=(end - span).isoformat(), end=end.isoformat()).json()
    assert body["resolution"] == expected


def test_raw_series_carry_the_stored_values(viewer_client, history):
    start = END - timedelta(seconds=10)
    body = get(viewer_client, start=start.isoformat()).json()
    chip0, chip1 = body["series"]
    assert (chip0["npu_id"], chip1["npu_id"]) == (0, 1)
    assert chip0["time"] == [(END - timedelta(seconds=s)).timestamp() for s in (10, 5, 0)]
    assert chip0["aicore_percent"] == [2.0, 1.0, 0.0] == chip0["aicore_percent_max"]
    assert chip0["samples"] == [1, 1, 1] and chip0["health"] == ["OK"] * 3
    assert (chip1["aicore_percent"], chip1["health"]) == ([77.0], ["Alarm"])


def test_explicit_resolution_and_unix_seconds(viewer_client, history):
    start = int((END - timedelta(hours=5)).timestamp())
    body = get(viewer_client, npu_id=0, start=start, resolution="1h").json()
    (chip0,) = body["series"]
    assert body["resolution"] == "1h" and len(chip0["time"]) == 5
    assert chip0["aicore_percent"] == [2.0] * 5 and chip0["samples"] == [12] * 5


def test_series_are_capped_keeping_the_newest_points(viewer_client, history, monkeypatch):
    monkeypatch.setattr(series, "MAX_POINTS", 4)
    body = get(viewer_client, npu_id=0, start=(END - timedelta(hours=1)).isoformat()).json()
    assert body["truncated"] is True
    assert body["series"][0]["aicore_percent"] == [3.0, 2.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"start": (END + timedelta(seconds=1)).isoformat()}, "start"),
        ({"resolution": "5m"}, "resolution"),
        ({"npu_id": -1}, "npu_id"),
        ({"start": "yesterday"}, "start"),
    ],
)
def test_bad_input_is_422_naming_the_field(viewer_client, history, params, field):
    resp = get(viewer_client, **params)
    assert resp.status_code == 422, resp.content
    assert resp.json()["field"] == field


def test_series_of_an_unknown_node_is_404(viewer_client, db):
    assert get(viewer_client, node="nope").status_code == 404


def test_chart_series_has_the_chart_helper_format(history):
    sample(history, END - timedelta(seconds=2), npu_id=1, hbm_used_mb=16_384, temperature_c=55.5)
    chart = series.chart_series(history.pk, 1, 0, minutes=10, now=END)
    assert chart == {
        "x": [int(END.timestamp()) - 2, int(END.timestamp())],
        "series": [
            {"label": "AICore %", "values": [10.0, 77.0]},
            {"label": "HBM %", "values": [25.0, 1.5]},
            {"label": "Temp °C", "values": [55.5, 40.0]},
        ],
        "yLabel": "%",
    }
    week = series.chart_series(history.pk, 0, 0, minutes=7 * 24 * 60, now=END)
    assert len(week["x"]) == 7 * 24 and set(week["series"][0]["values"]) == {2.0}
