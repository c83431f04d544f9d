"""Placement and the reconcile loop, with engine reports applied as the agent sends them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from django.db import connection

from console.accounts.services import Actor
from console.deployments import services
from console.deployments.engines import apply_report
from console.deployments.models import NpuAllocation, Replica, ReplicaEvent, engine_api_key
from console.deployments.reconcile import reconcile
from console.deployments.schemas import DeploymentIn
from console.inventory.models import Accelerator
from tests.factories import make_node

SPEC = {
    "model_path": "/models/m",
    "model_label": "",
    "served_model_name": "m",
    "device": "npu",
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "dtype": "auto",
    "max_model_len": 4096,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "gpu_memory_utilization": 0.9,
    "block_size": 128,
    "enforce_eager": False,
    "quantization": "",
    "trust_remote_code": False,
    "extra_args": [],
    "extra_env": {},
    "replicas": 2,
    "node_selector": {},
    "npus_per_replica": 2,
    "npu_ids": [],
    "reschedule_on_node_loss": False,
}


@pytest.fixture
def actor(operator):
    return Actor(user=operator, name="otto")


@pytest.fixture(autouse=True)
def no_dispatch(monkeypatch):
    sent = []
    monkeypatch.setattr(
        "console.deployments.reconcile.dispatch_start", lambda r: sent.append(("start", r.pk))
    )
    monkeypatch.setattr(
        "console.deployments.reconcile.dispatch_stop_replica",
        lambda r: sent.append(("stop", r.pk)),
    )
    return sent


def deploy(actor, name="d1", **spec):
    return services.create_deployment(actor=actor, payload=DeploymentIn(name=name, **SPEC | spec))


def running(actor, replicas=1, npus=8, **spec):
    """One node `a`, deployment d1 started and reconciled once: its replicas, by index."""
    make_node("a", npus=npus)
    deploy(actor, replicas=replicas, **spec)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    return list(Replica.objects.order_by("index"))


def report(replica, phase, **extra):
    return apply_report(
        {
            "node": replica.node.name,
            "replica_id": replica.pk,
            "generation": replica.generation,
            "phase": phase,
            "at": datetime.now(UTC).isoformat(),
            **extra,
        },
        node=replica.node.name,
    )


def test_replicas_spread_across_nodes_on_the_least_loaded_npus(actor, fake_inspect, no_dispatch):
    make_node("a", npus=8)
    make_node("b", npus=8)
    deploy(actor)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    placed = list(Replica.objects.order_by("index"))
    assert [r.state for r in placed] == ["scheduled", "scheduled"]
    assert {r.node.name for r in placed} == {"a", "b"}  # spread
    assert all(len(r.npu_list) == 2 for r in placed)
    assert len(no_dispatch) == 2
    assert "placed on" in placed[0].state_reason


def test_lifecycle_events_form_a_timeline(actor, fake_inspect):
    make_node("a", npus=4)
    deploy(actor, replicas=1)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    for phase in ("starting", "loading", "ready"):
        report(replica, phase, reason=f"engine {phase}")
    replica.refresh_from_db()
    assert replica.state == "ready"
    assert list(ReplicaEvent.objects.values_list("to_state", flat=True)) == [
        "scheduled",
        "starting",
        "loading",
        "ready",
    ]
    services.set_desired(actor=actor, name="d1", state="stopped")
    reconcile()
    replica.refresh_from_db()
    assert replica.state == "stopping"
    report(replica, "stopped", reason="stopped as asked")
    replica.refresh_from_db()
    assert replica.state == "stopped" and replica.port is None
    assert not NpuAllocation.objects.exists()


def test_no_capacity_says_why_and_keeps_waiting(actor, fake_inspect):
    node = make_node("a", npus=2)
    Accelerator.objects.filter(node=node, npu_id=1).update(isolated=True, isolation_reason="ECC")
    deploy(actor, replicas=1)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "pending"
    assert "1 isolated" in replica.state_reason and "needs 2" in replica.state_reason


def test_an_npu_cannot_be_allocated_twice(actor, fake_inspect):
    from django.db import IntegrityError, transaction

    node = make_node("a", npus=2)
    deploy(actor, replicas=1)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    taken = Accelerator.objects.filter(node=node, allocation__isnull=False).first()
    with pytest.raises(IntegrityError), transaction.atomic():
        NpuAllocation.objects.create(accelerator=taken, replica=replica)


@pytest.mark.django_db(transaction=True)
def test_concurrent_reconciles_never_double_book(operator, fake_inspect):
    actor = Actor(user=operator, name="otto")
    make_node("a", npus=4)
    for i in range(4):
        deploy(actor, name=f"d{i}", replicas=1)
        services.set_desired(actor=actor, name=f"d{i}", state="running")
    errors = []

    def run():
        try:
            reconcile()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    ids = list(NpuAllocation.objects.values_list("accelerator_id", flat=True))
    assert len(ids) == len(set(ids)) == 4  # two deployments fit, each took 2, none shared
    assert Replica.objects.filter(state="scheduled").count() == 2


def test_offline_node_makes_replicas_unknown_not_stopped(actor, fake_inspect, no_dispatch):
    node = make_node("a", npus=4)
    deploy(actor, replicas=1)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    report(replica, "ready")
    node.status = "offline"
    node.save()
    reconcile()
    replica.refresh_from_db()
    assert replica.state == "unknown" and "may still be serving" in replica.state_reason
    assert NpuAllocation.objects.filter(replica=replica).count() == 2
    assert ("stop", replica.pk) not in no_dispatch


def test_crash_loop_report_is_shown_and_not_restarted(actor, fake_inspect, no_dispatch):
    make_node("a", npus=4)
    deploy(actor, replicas=1)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    report(replica, "failed", reason="exit code 1", exit_code=1, log_tail=["RuntimeError: boom"])
    report(replica, "crash-loop", reason="5 crashes in 600s: not restarting", exit_code=1)
    before = len(no_dispatch)
    reconcile()
    replica.refresh_from_db()
    assert replica.state == "crash-loop" and replica.log_tail == ["RuntimeError: boom"]
    assert len(no_dispatch) == before


def test_scale_down_stops_the_extra_replica(actor, fake_inspect, no_dispatch):
    make_node("a", npus=8)
    deploy(actor, replicas=2)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    services.set_desired(actor=actor, name="d1", state="running", replicas=1)
    reconcile()
    assert Replica.objects.get(index=1).state == "stopping"
    assert Replica.objects.get(index=0).state == "scheduled"


def test_a_report_older_than_the_known_state_is_ignored(actor, fake_inspect):
    from datetime import timedelta

    make_node("a", npus=4)
    deploy(actor, replicas=1)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    report(replica, "starting")
    report(replica, "failed", reason="exit code 1")
    stale = datetime.now(UTC) - timedelta(seconds=30)
    apply_report(
        {
            "node": "a",
            "replica_id": replica.pk,
            "generation": replica.generation,
            "phase": "starting",
            "at": stale.isoformat(),
        },
        node="a",
    )
    replica.refresh_from_db()
    assert replica.state == "failed"


def test_engine_charts_come_from_heartbeat_metrics(redis_url):
    import json as _json

    from console.deployments.engines import engine_charts, series_key
    from console.hot import get_redis

    r = get_redis()
    r.delete(series_key(999))
    for i, gen in enumerate((0, 50, 150)):
        r.rpush(
            series_key(999),
            _json.dumps(
                {
                    "at": f"2026-12-02T10:00:{i * 5:02d}+00:00",
                    "generation_tokens_total": gen,
                    "num_requests_running": 1,
                    "num_requests_waiting": i,
                    "kv_cache_usage_perc": 0.5,
                }
            ),
        )
    charts = {c["title"]: _json.loads(c["json"]) for c in engine_charts(999)}
    assert charts["Output tokens/s"]["series"][0]["values"] == [None, 10.0, 20.0]
    assert charts["Requests"]["series"][1]["values"] == [0, 1, 2]
    assert charts["KV cache used %"]["series"][0]["values"] == [50.0, 50.0, 50.0]
    r.delete(series_key(999))


def test_the_engine_spec_carries_the_placed_npus_in_order(actor, fake_inspect):
    from console.deployments.engines import build_spec

    node = make_node("a", npus=4)
    Accelerator.objects.filter(node=node).update(logic_id=None)
    deploy(actor, replicas=1)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    spec = build_spec(replica)
    assert spec.npu_ids == sorted(spec.npu_ids) and len(spec.npu_ids) == 2
    assert (spec.tensor_parallel_size, spec.block_size, spec.host, spec.port) == (
        2,
        128,
        "0.0.0.0",
        replica.port,
    )
    assert spec.api_key == engine_api_key(replica.pk)  # the engine's key, by env on the host
    assert spec.api_key not in repr(spec)


def test_a_port_the_host_reports_listening_is_never_given_to_an_engine(
    actor, fake_inspect, settings
):
    from console.inventory import ports

    settings.ENGINE_PORT_RANGE = range(8100, 8110)
    ports.record_listening("a", [8100, 8101, 22])
    (replica,) = running(actor)
    assert replica.port == 8102


def test_a_start_refused_for_a_busy_port_is_placed_again_on_another_port(actor, fake_inspect):
    (replica,) = running(actor)
    first = replica.port
    report(replica, "failed", reason=f"port {first} is already in use on this host (bind test)")
    replica.refresh_from_db()
    assert replica.state == "pending" and replica.port is None
    reasons = list(
        ReplicaEvent.objects.filter(replica=replica).order_by("at").values_list("reason", flat=True)
    )
    assert any("already in use" in r for r in reasons)
    assert any("placing the replica again on a free port" in r for r in reasons)
    reconcile()
    replica.refresh_from_db()
    assert replica.state == "scheduled" and replica.port not in (None, first)
    # and no incident is opened for what the console repaired itself
    from console.diagnosis.models import Incident

    assert not Incident.objects.exists()


def test_the_engine_port_range_is_a_setting(monkeypatch):
    from console import env

    monkeypatch.setenv("NPU_ENGINE_PORTS", "20000-20099")
    assert env.get_port_range("NPU_ENGINE_PORTS", (8100, 8999)) == range(20000, 20100)
    monkeypatch.setenv("NPU_ENGINE_PORTS", "80-90")
    with pytest.raises(env.EnvError, match="NPU_ENGINE_PORTS"):
        env.get_port_range("NPU_ENGINE_PORTS", (8100, 8999))


def test_scale_down_removes_the_failed_replica_and_keeps_the_ready_one(
    actor, fake_inspect, no_dispatch
):
    first, second = running(actor, replicas=2)
    report(first, "failed", reason="exit code 1", exit_code=1)
    report(second, "ready")
    services.set_desired(actor=actor, name="d1", state=None, replicas=1)
    reconcile()
    second.refresh_from_db()
    first.refresh_from_db()
    assert second.index == 0 and second.state == "ready"  # kept, renumbered first
    assert first.index == 1 and first.state in {"stopping", "stopped"}


def test_an_update_keeps_a_stop_committed_while_it_was_validating(actor, fake_inspect):
    running(actor)
    before = services.get_deployment("d1").spec_version

    def slow_inspect(node, path, timeout=20.0):
        # someone stops the deployment while the agent is asked about the model
        services.set_desired(actor=actor, name="d1", state="stopped")
        services.restart_deployment(actor=actor, name="d1")
        return dict(fake_inspect, path=path)

    dep = services.update_deployment(
        actor=actor,
        name="d1",
        payload=DeploymentIn(name="d1", **SPEC | {"replicas": 1, "max_model_len": 2048}),
        inspect=slow_inspect,
    )
    dep.refresh_from_db()
    assert dep.desired_state == "stopped"  # the stop is not undone
    assert dep.max_model_len == 2048
    assert dep.spec_version == before + 2  # the restart's bump and the update's, both kept
