"""Routing reads the replicas' scraped metrics from Redis: whatever is there, it never fails."""

from __future__ import annotations

import pytest

from console.deployments.engines import engine_metrics, metrics_key
from console.deployments.models import Deployment, Replica
from console.gateway.routing import _read_table, scraped_load
from console.hot import get_redis
from tests.kit import make_deployment, make_node, make_replica

pytestmark = pytest.mark.django_db

PLANTED = [
    b'{"num_requests_running": "lots", "num_requests_waiting": [1]}',
    b"not json {",
    b'{"num_requests_running": NaN, "num_requests_waiting": -4}',
    b"[1, 2, 3]",
    b'{"num_requests_running": 1e999, "num_requests_waiting": 1e999}',
    b'{"num_requests_running": true, "at": 5}',
    b"\xff\xfe",
    b'{"num_requests_running": 3, "num_requests_waiting": 1}',
]


@pytest.fixture
def replicas(redis_url):
    node = make_node("gw-node", address="")
    dep = make_deployment(
        "dep-bad", model_path="/models/x", served_model_name="model-bad", device="cpu"
    )
    made = [make_replica(dep, node=node) for _ in PLANTED]
    r = get_redis()
    for replica, raw in zip(made, PLANTED, strict=True):
        r.set(metrics_key(replica.pk), raw, ex=60)
    yield made
    r.delete(*[metrics_key(x.pk) for x in made])


def test_bad_metrics_in_redis_never_fail_the_routing_table(replicas, caplog):
    table = _read_table()
    loads = {up.replica_id: up.scraped_load for up in table.by_model["model-bad"]}
    assert len(loads) == len(PLANTED)
    assert all(load >= 0 and load != float("inf") for load in loads.values())
    assert loads[replicas[-1].pk] == 4.0  # the good one still counts
    assert loads[replicas[0].pk] == loads[replicas[2].pk] == 0.0
    assert "replica" in caplog.text  # skipped entries are logged


def test_engine_metrics_keep_only_numbers(replicas):
    metrics = engine_metrics([r.pk for r in replicas])
    assert replicas[1].pk not in metrics and replicas[3].pk not in metrics
    for doc in metrics.values():
        assert all(isinstance(v, float) for k, v in doc.items() if k != "at")
    assert metrics[replicas[5].pk] == {"at": None}


@pytest.mark.parametrize(
    "metrics",
    [{}, {"num_requests_running": "x"}, {"num_requests_waiting": None}, {"x": 1}],
)
def test_scraped_load_of_nonsense_is_zero(metrics):
    assert scraped_load(metrics) == 0.0


def test_replicas_on_simulated_nodes_are_never_upstreams(redis_url):
    """Their engines are simulated by the agent (workers/engine/simulated.py): nothing listens
    on their ports, so they are left out, and a model served only there is named as such."""
    sim = make_node("demo-sim", simulated=True)
    real = make_node("kp-real")
    both = Deployment.objects.create(name="both", model_path="/m", served_model_name="m-both")
    only = Deployment.objects.create(name="only", model_path="/m", served_model_name="m-sim")
    Replica.objects.create(deployment=both, index=0, node=sim, port=9100, state="ready")
    kept = Replica.objects.create(deployment=both, index=1, node=real, port=9101, state="ready")
    Replica.objects.create(deployment=only, index=0, node=sim, port=9102, state="ready")
    table = _read_table()
    assert [up.replica_id for up in table.by_model["m-both"]] == [kept.pk]
    assert "m-sim" not in table.by_model and table.simulated_only == {"m-sim"}
