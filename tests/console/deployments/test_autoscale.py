"""Autoscaling (console/deployments/autoscale.py): decisions from the heartbeat series of the
ready replicas, sustained only; bounds, free NPUs and cool-down respected; every decision an
event with its numbers; the policy's API. Promise: docs/operations.md "Autoscaling"."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from console.accounts.models import AuditEntry
from console.deployments import autoscale
from console.deployments.engines import series_key, series_points
from console.deployments.models import Autoscaler, Deployment, Rollout, ScalingEvent
from console.deployments.reconcile import reconcile
from console.hot import get_redis
from tests.helpers import client_for, make_user
from tests.kit import make_deployment, make_node, make_replica

pytestmark = pytest.mark.django_db

NOW = 1_800_000_000.0  # the decision time the tests pass in


def feed(replica, seconds: int, waiting: float, kv: float = 0.1, every: int = 5) -> None:
    """Heartbeat points for `replica` over the `seconds` before NOW (what record_point stores)."""
    r = get_redis()
    for ago in range(seconds, -1, -every):
        at = datetime.fromtimestamp(NOW - ago, UTC).isoformat()
        doc = {"at": at, "num_requests_waiting": waiting, "kv_cache_usage_perc": kv}
        r.rpush(series_key(replica.pk), json.dumps(doc))


@pytest.fixture
def dep(redis_url):
    """A running 1-NPU-per-replica deployment with one ready replica on a 4-NPU node, and an
    autoscaler 1..3 (window 60 s, cool-down 300 s)."""
    _clear_series()
    node = make_node("as-node", npus=4)
    d = make_deployment(
        "grow", device="npu", npus_per_replica=1, replicas=1, desired_state="running"
    )
    make_replica(d, node=node, state="ready", spec_version=d.spec_version)
    Autoscaler.objects.create(deployment=d, min_replicas=1, max_replicas=3)
    yield d
    _clear_series()


def _clear_series() -> None:
    """Row ids come back between tests: no series may outlive its test."""
    r = get_redis()
    for key in r.scan_iter(series_key("*")):
        r.delete(key)


def policy(d: Deployment) -> Autoscaler:
    return Autoscaler.objects.select_related("deployment").get(deployment=d)


def test_sustained_waiting_adds_replicas_by_the_ratio_and_reconcile_places_them(dep):
    feed(dep.replica_set.get(), 60, waiting=5)  # 2.5x the target of 2
    event = autoscale.evaluate(policy(dep), now=NOW)
    dep.refresh_from_db()
    assert dep.replicas == 3  # ceil(1 * 2.5)
    assert (event.action, event.from_replicas, event.to_replicas) == ("up", 1, 3)
    assert event.numbers["waiting_per_replica"] == 5 and event.numbers["room"] >= 2
    assert "5.0 waiting per replica (target 2)" in event.reason
    audit = AuditEntry.objects.get(action="deployment.autoscale")
    assert audit.actor == "autoscaler" and audit.after["replicas"] == 3
    reconcile()
    assert dep.replica_set.filter(state="scheduled").count() == 2  # placed on free NPUs


def test_high_kv_cache_alone_scales_up(dep):
    feed(dep.replica_set.get(), 60, waiting=0, kv=0.95)
    event = autoscale.evaluate(policy(dep), now=NOW)
    assert event.action == "up" and event.to_replicas == 2
    assert event.numbers["kv_cache_percent"] == 95.0


def test_a_spike_is_not_sustained_load(dep):
    feed(dep.replica_set.get(), 20, waiting=50)  # 20 s of a 60 s window
    assert autoscale.evaluate(policy(dep), now=NOW) is None
    dep.refresh_from_db()
    assert dep.replicas == 1
    assert policy(dep).status.startswith("measuring")


def test_never_past_max(dep):
    Autoscaler.objects.filter(deployment=dep).update(max_replicas=2)
    feed(dep.replica_set.get(), 60, waiting=100)
    assert autoscale.evaluate(policy(dep), now=NOW).to_replicas == 2
    dep.refresh_from_db()
    make_replica(dep, node=dep.replica_set.get(index=0).node, state="ready")
    feed(dep.replica_set.get(index=1), 60, waiting=100)
    Autoscaler.objects.filter(deployment=dep).update(changed_at=None)
    assert autoscale.evaluate(policy(dep), now=NOW) is None
    assert policy(dep).status.startswith("at max (2)")


def test_no_free_npus_waits_for_capacity_once_with_the_reason(dep, redis_url):
    from console.inventory.models import Accelerator

    Accelerator.objects.filter(node__name="as-node").update(
        isolated=True, isolation_reason="maintenance"
    )
    feed(dep.replica_set.get(), 60, waiting=10)
    first = autoscale.evaluate(policy(dep), now=NOW)
    assert first.action == "capacity" and first.to_replicas == first.from_replicas == 1
    assert "waiting for capacity" in first.reason and "isolated" in first.reason
    assert policy(dep).status.startswith("waiting for capacity")
    assert autoscale.evaluate(policy(dep), now=NOW) is None  # said once
    dep.refresh_from_db()
    assert dep.replicas == 1 and ScalingEvent.objects.count() == 1


def test_idle_for_the_cooldown_removes_one_never_below_min(dep):
    node = dep.replica_set.get().node
    make_replica(dep, node=node, state="ready")
    Deployment.objects.filter(pk=dep.pk).update(replicas=2)
    for r in dep.replica_set.all():
        feed(r, 300, waiting=0, kv=0.05)
    event = autoscale.evaluate(policy(dep), now=NOW)
    assert (event.action, event.from_replicas, event.to_replicas) == ("down", 2, 1)
    assert event.numbers["peak_waiting"] == 0
    dep.refresh_from_db()
    assert dep.replicas == 1
    Autoscaler.objects.filter(deployment=dep).update(changed_at=None)
    assert autoscale.evaluate(policy(dep), now=NOW) is None  # at min


def test_no_scale_down_within_the_cooldown_or_when_a_request_waited(dep):
    node = dep.replica_set.get().node
    make_replica(dep, node=node, state="ready")
    Deployment.objects.filter(pk=dep.pk).update(replicas=2)
    for r in dep.replica_set.all():
        feed(r, 300, waiting=0, kv=0.05)
    get_redis().rpush(
        series_key(dep.replica_set.get(index=1).pk),
        json.dumps(
            {"at": datetime.fromtimestamp(NOW - 100, UTC).isoformat(), "num_requests_waiting": 1}
        ),
    )
    assert autoscale.evaluate(policy(dep), now=NOW) is None  # one request waited 100 s ago
    for r in dep.replica_set.all():
        get_redis().delete(series_key(r.pk))
        feed(r, 300, waiting=0, kv=0.05)
    Autoscaler.objects.filter(deployment=dep).update(
        changed_at=datetime.fromtimestamp(NOW - 200, UTC)
    )
    assert autoscale.evaluate(policy(dep), now=NOW) is None  # changed 200 s ago: cooling down
    dep.refresh_from_db()
    assert dep.replicas == 2


def test_holds_while_a_replica_comes_up_or_a_rollout_runs(dep):
    feed(dep.replica_set.get(), 60, waiting=10)
    starting = make_replica(dep, node=dep.replica_set.get().node, state="starting")
    Deployment.objects.filter(pk=dep.pk).update(replicas=2)
    assert autoscale.evaluate(policy(dep), now=NOW) is None
    assert "coming up" in policy(dep).status
    starting.delete()
    Deployment.objects.filter(pk=dep.pk).update(replicas=1)
    Rollout.objects.create(deployment=dep, to_version=2, target_version=2)
    assert autoscale.evaluate(policy(dep), now=NOW) is None
    assert "rolling update" in policy(dep).status


def test_a_heartbeat_series_feeds_the_decision(dep):
    """record_point (the heartbeat path) writes what series_points reads back."""
    from console.deployments.engines import record_point

    replica = dep.replica_set.get()
    r = get_redis()
    pipe = r.pipeline()
    at = datetime.fromtimestamp(NOW, UTC).isoformat()
    record_point(pipe, replica.pk, json.dumps({"at": at, "num_requests_waiting": 3}))
    pipe.execute()
    assert [p["num_requests_waiting"] for p in series_points(replica.pk, NOW - 1)] == [3.0]
    assert 0 < r.ttl(series_key(replica.pk)) <= 3600


# --- the API --------------------------------------------------------------------------------
def put(client, name: str, body: dict):
    return client.put(
        f"/api/v1/deployments/{name}/autoscaler", body, content_type="application/json"
    )


def test_api_sets_clamps_reads_and_removes(dep):
    op = client_for(make_user("as-op", "operator"))
    Autoscaler.objects.all().delete()
    resp = put(op, "grow", {"min_replicas": 2, "max_replicas": 4, "kv_target": 70})
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert (body["min_replicas"], body["max_replicas"], body["kv_target"]) == (2, 4, 70)
    assert body["replicas"] == 2  # brought within the bounds at once
    assert body["events"][0]["action"] == "bounds"
    got = op.get("/api/v1/deployments/grow/autoscaler").json()
    assert got["waiting_target"] == 2.0 and got["window_s"] == 60
    # a manual scale outside the bounds is refused with the field and the reason
    resp = op.post(
        "/api/v1/deployments/grow/scale", {"replicas": 5}, content_type="application/json"
    )
    assert resp.status_code == 422 and resp.json()["field"] == "replicas"
    assert "2..4" in resp.json()["message"]
    assert op.delete("/api/v1/deployments/grow/autoscaler").status_code == 204
    assert op.get("/api/v1/deployments/grow/autoscaler").status_code == 404
    assert AuditEntry.objects.filter(action="deployment.autoscaler.off").exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"min_replicas": 0, "max_replicas": 2}, "min_replicas"),
        ({"min_replicas": 1, "max_replicas": 2, "kv_target": 120}, "kv_target"),
        ({"min_replicas": 1, "max_replicas": 2, "window_s": 1}, "window_s"),
        ({"min_replicas": 1, "max_replicas": 2, "max_replica": 9}, "max_replica"),
    ],
)
def test_api_refuses_bad_bounds_with_the_field(dep, body, field):
    op = client_for(make_user("as-op2", "operator"))
    resp = put(op, "grow", body)
    assert resp.status_code == 422, resp.content
    assert field in json.dumps(resp.json())
    assert policy(dep).max_replicas == 3  # nothing changed


def test_viewers_read_but_cannot_change(dep):
    viewer = client_for(make_user("as-view", "viewer"))
    assert viewer.get("/api/v1/deployments/grow/autoscaler").status_code == 200
    assert put(viewer, "grow", {"min_replicas": 1, "max_replicas": 5}).status_code == 403
    assert viewer.delete("/api/v1/deployments/grow/autoscaler").status_code == 403
    assert policy(dep).max_replicas == 3


def test_run_survives_one_bad_deployment(dep, monkeypatch):
    other = make_deployment("other", replicas=1, desired_state="running")
    Autoscaler.objects.create(deployment=other, min_replicas=1, max_replicas=2)
    real = autoscale.evaluate

    def flaky(p, now=None):
        if p.deployment.name == "other":
            raise RuntimeError("boom")
        return real(p, now=NOW)

    monkeypatch.setattr(autoscale, "evaluate", flaky)
    feed(dep.replica_set.get(), 60, waiting=5)
    assert autoscale.run() == {"changed": 1}
