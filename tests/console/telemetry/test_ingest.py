"""Heartbeat ingest: latest values and buffered samples in Redis, flushed to the database."""

from __future__ import annotations

import json
from datetime import timedelta
from unittest import mock

import pytest

from console.telemetry import services
from console.telemetry.models import ChipSample, HealthCode
from tests.console.telemetry.builders import T0, chip, heartbeat
from tests.factories import make_node


def record(node, hb, at=T0):
    services.record_heartbeat(node_id=node.pk, node_name=node.name, received_at=at, hb=hb)


def test_record_heartbeat_stores_latest_and_buffers_without_any_query(
    hot, db, django_assert_num_queries
):
    node = make_node("kp-01")
    hb = heartbeat("kp-01", [chip(0), chip(1, health="Warning")])
    with django_assert_num_queries(0):
        record(node, hb)
    doc = services.latest("kp-01", now=T0 + timedelta(seconds=2))
    assert doc["received_at"] == T0.isoformat()
    assert [c["npu_id"] for c in doc["chips"]] == [0, 1]
    assert doc["chips"][1]["health"] == "Warning"
    assert doc["processes"][0]["pid"] == 4242
    assert (doc["telemetry_ok"], doc["age_s"], doc["stale"]) == (True, 2.0, False)
    assert 0 < hot.ttl(services.latest_key("kp-01")) <= 50  # 10 intervals of 5 s
    (row,) = hot.lrange(services.samples_key(), 0, -1)
    node_id, ms, chips = json.loads(row)
    assert (node_id, ms, len(chips)) == (node.pk, int(T0.timestamp() * 1000), 2)


def test_latest_is_stale_after_three_intervals_and_none_when_never_seen(hot, db):
    node = make_node("kp-01")
    record(node, heartbeat("kp-01", [chip(0)]))
    assert services.latest("kp-01", now=T0 + timedelta(seconds=15))["stale"] is False
    assert services.latest("kp-01", now=T0 + timedelta(seconds=16))["stale"] is True
    assert services.latest("never-seen") is None


def test_latest_many_answers_every_name_in_one_round_trip(hot, db):
    a, b = make_node("a"), make_node("b")
    record(a, heartbeat("a", [chip(0)]))
    record(b, heartbeat("b", [chip(0), chip(1)]), at=T0 + timedelta(seconds=1))
    docs = services.latest_many(["b", "a", "zz"], now=T0 + timedelta(seconds=3))
    assert list(docs) == ["b", "a", "zz"]
    assert len(docs["b"]["chips"]) == 2 and docs["a"]["age_s"] == 3.0 and docs["zz"] is None
    assert services.latest_many([]) == {}


def test_flush_moves_buffered_samples_into_the_database(hot, db):
    node = make_node("kp-01")
    for i in range(3):
        hb = heartbeat("kp-01", [chip(0, aicore_percent=10.0 * i), chip(1, health="Alarm")])
        record(node, hb, at=T0 + timedelta(seconds=5 * i))
    assert services.flush_samples() == 3
    assert hot.llen(services.samples_key()) == 0
    rows = ChipSample.objects.filter(npu_id=0).order_by("time")
    assert [r.aicore_percent for r in rows] == [0.0, 10.0, 20.0]
    assert [r.time for r in rows] == [T0 + timedelta(seconds=5 * i) for i in range(3)]
    first = rows[0]
    assert (first.hbm_used_mb, first.hbm_total_mb, first.temperature_c) == (32_768, 65_536, 41.0)
    assert (first.power_w, first.memory_used_mb, first.health) == (90.5, 2_000, HealthCode.OK)
    assert set(ChipSample.objects.filter(npu_id=1).values_list("health", flat=True)) == {
        HealthCode.ALARM
    }
    assert services.flush_samples() == 0


def test_flush_is_idempotent_for_repeated_beats_and_a_crash_before_trim(hot, db):
    node = make_node("kp-01")
    hb = heartbeat("kp-01", [chip(0), chip(1)])
    record(node, hb)
    record(node, hb)  # the same beat delivered twice
    record(node, hb, at=T0 + timedelta(seconds=5))
    died = ConnectionError("worker died after the insert, before the trim")
    with mock.patch.object(type(hot), "ltrim", side_effect=died), pytest.raises(ConnectionError):
        services.flush_samples()
    assert ChipSample.objects.count() == 4  # stored, but still buffered
    assert hot.llen(services.samples_key()) == 3
    assert services.flush_samples() == 3  # read again: the duplicates are dropped
    assert ChipSample.objects.count() == 4
    assert hot.llen(services.samples_key()) == 0


def test_flush_drops_beats_of_deleted_nodes_and_undecodable_rows(hot, db):
    kept, gone = make_node("kept"), make_node("gone")
    record(kept, heartbeat("kept", [chip(0)]))
    record(gone, heartbeat("gone", [chip(0)]))
    hot.rpush(services.samples_key(), b"not json", b"[1, 2]", b"[1, 0, [[70000, 0]]]")
    record(kept, heartbeat("kept", [chip(0, hbm_used_mb=2**40, aicore_percent=float("nan"))]),
           at=T0 + timedelta(seconds=5))  # fmt: skip
    gone.delete()
    assert services.flush_samples() == 6
    assert list(ChipSample.objects.values_list("node__name", flat=True)) == ["kept", "kept"]
    odd = ChipSample.objects.get(time=T0 + timedelta(seconds=5))
    assert (odd.hbm_used_mb, odd.aicore_percent) == (None, None)  # out of range -> NULL


def test_only_one_flusher_runs_at_a_time(hot, db):
    node = make_node("kp-01")
    record(node, heartbeat("kp-01", [chip(0)]))
    held = hot.lock(services.flush_lock_key(), timeout=30)
    assert held.acquire(blocking=False)
    try:
        assert services.flush_samples() == 0
        assert hot.llen(services.samples_key()) == 1
    finally:
        held.release()
    assert services.flush_samples() == 1


def test_flush_works_through_batches(hot, db):
    node = make_node("kp-01")
    for i in range(7):
        record(node, heartbeat("kp-01", [chip(0)]), at=T0 + timedelta(seconds=5 * i))
    assert services.flush_samples(batch=3) == 7
    assert ChipSample.objects.count() == 7


def test_the_buffer_is_capped_oldest_dropped_first(hot, db, monkeypatch):
    monkeypatch.setattr(services, "MAX_BUFFERED_BEATS", 2)
    node = make_node("kp-01")
    for i in range(3):
        record(node, heartbeat("kp-01", [chip(0)]), at=T0 + timedelta(seconds=5 * i))
    services.flush_samples()
    assert sorted(ChipSample.objects.values_list("time", flat=True)) == [
        T0 + timedelta(seconds=5),
        T0 + timedelta(seconds=10),
    ]


def test_a_caller_pipeline_carries_the_commands(hot, db):
    node = make_node("kp-01")
    pipe = hot.pipeline(transaction=False)
    services.record_heartbeat(
        node_id=node.pk,
        node_name="kp-01",
        received_at=T0,
        hb=heartbeat("kp-01", [chip(0)]),
        pipe=pipe,
    )
    assert services.latest("kp-01", now=T0) is None  # queued, not yet sent
    pipe.execute()
    assert services.latest("kp-01", now=T0)["chips"][0]["npu_id"] == 0
