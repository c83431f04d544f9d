"""The dashboard's fleet totals come from one small summary per node in the hot store (written
with each beat), so they cover the whole fleet while the heatmap shows one page of nodes."""

from __future__ import annotations

import math
import random
from datetime import timedelta

from django.utils import timezone

from console.inventory import live
from console.telemetry import services
from tests.console.telemetry.builders import chip, heartbeat
from tests.factories import make_node


def beat(node, chips, age_s: float = 0.0):
    at = timezone.now() - timedelta(seconds=age_s)
    hb = heartbeat(node.name, chips, sent_at=at)
    services.record_heartbeat(node_id=node.pk, node_name=node.name, received_at=at, hb=hb)


def test_totals_from_summaries_equal_totals_from_the_latest_beats(hot, db):
    a, b = make_node("a1"), make_node("b2")
    beat(a, [chip(0, aicore_percent=10.0, hbm_used_mb=1024), chip(1, health="Warning")])
    beat(b, [chip(0, aicore_percent=40.0, temperature_c=90.0, hbm_used_mb=None)])
    latest = services.latest_many(["a1", "b2"])
    chips = [c for d in latest.values() for c in d["chips"]]
    used = sum(live.memory_pct(c)[0] or 0 for c in chips)
    total = sum(live.memory_pct(c)[1] or 0 for c in chips)
    aicore = [c["aicore_percent"] for c in chips if c.get("aicore_percent") is not None]
    totals = live.totals_of(services.fleet_totals())
    assert totals == {
        "chips": 3,
        "hbm_used_gb": round(used / 1024, 1),
        "hbm_total_gb": round(total / 1024, 1),
        "hbm_pct": round(100 * used / total, 1),
        "aicore_mean": round(sum(aicore) / len(aicore), 1),
        "alerts": 2,  # the Warning chip and the 90 °C one
    }


def test_a_node_gone_quiet_leaves_the_totals_with_its_latest_values(hot, db, settings):
    fresh, quiet = make_node("fresh"), make_node("quiet")
    beat(fresh, [chip(0)])
    ttl = settings.HEARTBEAT_INTERVAL_S * services.LATEST_TTL_BEATS
    beat(quiet, [chip(0), chip(1)], age_s=ttl + 1)
    assert live.totals_of(services.fleet_totals())["chips"] == 1
    assert hot.hkeys(services.fleet_key()) == [b"fresh"]  # the stale entry is removed


def test_dashboard_totals_count_nodes_beyond_the_heatmap_page(hot, db, viewer_client):
    nodes = [make_node(f"n{i:02d}") for i in range(60)]
    for node in nodes:
        beat(node, [chip(0, health="Alarm" if node.name == "n55" else "OK")])
    body = viewer_client.get("/").content.decode()
    assert body.count('class="heatmap-label"') == 50  # n55 is on page 2 ...
    assert 'data-testid="live-alerts">1<' in body  # ... and still counted


def test_fractional_aicore_survives_the_sum_and_unreadable_summaries_are_dropped(hot, db):
    a, b = make_node("a1"), make_node("b2")
    beat(a, [chip(0, aicore_percent=10.25)])
    beat(b, [chip(0, aicore_percent=40.5)])
    hot.hset(services.fleet_key(), "garbled", b"not json")
    hot.hset(services.fleet_key(), "short", b"[1,2]")
    totals = live.totals_of(services.fleet_totals())
    assert totals["chips"] == 2
    assert totals["aicore_mean"] == round((10.25 + 40.5) / 2, 1)  # 25.375 -> 25.4, not 25
    assert sorted(hot.hkeys(services.fleet_key())) == [b"a1", b"b2"]


def rebuilt_totals() -> list:
    """The totals computed afresh from every summary (what the running sums must equal)."""
    services.get_redis().delete(services.fleet_totals_key())
    return services.fleet_totals()


def test_running_totals_follow_every_beat_and_equal_a_rebuild(hot, db):
    rng = random.Random(7)
    nodes = [make_node(f"r{i}") for i in range(6)]
    services.fleet_totals()  # the running sums exist from here on: beats add their deltas
    for _ in range(60):
        node = rng.choice(nodes)
        chips = [
            chip(
                i,
                aicore_percent=rng.choice([None, rng.uniform(0, 100)]),
                hbm_used_mb=rng.randrange(0, 65_536),
                health=rng.choice(["OK", "OK", "Warning", "Alarm"]),
                temperature_c=rng.uniform(30, 95),
            )
            for i in range(rng.randrange(0, 5))
        ]
        beat(node, chips)
        running = services.fleet_totals()
        rebuilt = rebuilt_totals()
        assert running[:3] + running[4:] == rebuilt[:3] + rebuilt[4:]
        assert math.isclose(running[3], rebuilt[3], abs_tol=1e-6)  # the AICore float sum
    latest = services.latest_many([n.name for n in nodes])
    chips = [c for d in latest.values() if d for c in d["chips"]]
    assert services.fleet_totals()[0] == len(chips)


def test_a_node_going_quiet_is_taken_out_of_the_running_totals(hot, db, settings):
    a, b = make_node("a1"), make_node("b2")
    beat(a, [chip(0, aicore_percent=20.0)])
    beat(b, [chip(0, aicore_percent=60.0), chip(1, aicore_percent=60.0, health="Alarm")])
    assert live.totals_of(services.fleet_totals())["alerts"] == 1  # built here
    ttl = settings.HEARTBEAT_INTERVAL_S * services.LATEST_TTL_BEATS
    later = timezone.now() + timedelta(seconds=ttl - 1)
    beat(a, [chip(0, aicore_percent=30.0)], age_s=-(ttl - 1))  # a beats on, b goes quiet
    totals = live.totals_of(services.fleet_totals(now=later + timedelta(seconds=2)))
    assert (totals["chips"], totals["alerts"], totals["aicore_mean"]) == (1, 0, 30.0)
    assert hot.hkeys(services.fleet_key()) == [b"a1"]
    assert hot.zrange(services.fleet_seen_key(), 0, -1) == [b"a1"]
    assert services.get_redis().ttl(services.fleet_totals_key()) > 0  # rebuilt now and then


def test_beats_while_the_totals_are_missing_are_counted_by_the_rebuild(hot, db):
    a = make_node("a1")
    services.fleet_totals()
    hot.delete(services.fleet_totals_key())  # expired, or evicted by Redis
    beat(a, [chip(0), chip(1)])
    assert not hot.exists(services.fleet_totals_key())  # the beat did not start partial sums
    assert services.fleet_totals()[0] == 2


def test_readings_no_npu_reports_neither_poison_the_sums_nor_break_the_pages(
    hot, db, viewer_client
):
    a, b = make_node("a1"), make_node("b2")
    services.fleet_totals()
    beat(a, [chip(0, aicore_percent=20.0, hbm_used_mb=1024, hbm_total_mb=2048)])
    odd = chip(0, aicore_percent=float("nan"), hbm_used_mb=10**30, temperature_c=float("inf"))
    beat(b, [odd])
    beat(b, [chip(0, aicore_percent=40.0, hbm_used_mb=1024, hbm_total_mb=2048)])
    totals = live.totals_of(services.fleet_totals())
    assert (totals["aicore_mean"], totals["hbm_pct"], totals["chips"]) == (30.0, 50.0, 2)
    assert viewer_client.get("/").status_code == 200


def test_a_latest_beat_orjson_refuses_is_still_read(hot, db):
    at = timezone.now().isoformat()
    hot.set(services.latest_key("big"), f'{{"received_at":"{at}","chips":[],"seq":{10**400}}}')
    assert services.latest("big")["seq"] == 10**400
