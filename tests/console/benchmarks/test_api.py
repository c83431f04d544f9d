"""The benchmark API: start (ranges -> 422 with the field, no ready replica -> 409), roles,
execute on the worker's side against a fake engine, cancel, sweep, compare."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from console.accounts.models import AuditEntry
from console.benchmarks import services
from console.benchmarks.models import BenchmarkRun
from console.deployments.models import engine_api_key
from tests.console.benchmarks.conftest import BENCH
from tests.kit import closed_port, make_deployment, make_node, make_replica, wait_for

GOOD = {"prompt_tokens": 16, "output_tokens": 4, "concurrency": 2, "duration_s": 1}


def post(client, name: str, body: dict):
    return client.post(
        f"/api/v1/deployments/{name}/benchmarks", body, content_type="application/json"
    )


def test_operator_starts_a_run_queued_with_a_settings_snapshot_and_an_audit_row(
    operator_client, deployment
):
    resp = post(operator_client, "tiny", GOOD)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["status"] == "queued" and body["deployment"] == "tiny"
    assert body["created_by"] == "otto" and body["engine_settings"]["max_num_seqs"] == 4
    run = BenchmarkRun.objects.get(pk=body["id"])
    assert (run.concurrency, run.request_rate, run.duration_s) == (2, None, 1)
    assert AuditEntry.objects.filter(action="benchmark.start", object_id=str(run.pk)).exists()


def test_viewer_cannot_start_or_cancel_but_can_read(viewer_client, operator_client, deployment):
    assert post(viewer_client, "tiny", GOOD).status_code == 403
    run_id = post(operator_client, "tiny", GOOD).json()["id"]
    assert viewer_client.post(f"/api/v1/benchmarks/{run_id}/cancel").status_code == 403
    assert viewer_client.get(f"/api/v1/benchmarks/{run_id}").status_code == 200
    assert viewer_client.get("/api/v1/benchmarks?deployment=tiny").json()["count"] == 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"output_tokens": 0}, "output_tokens"),
        ({"prompt_tokens": -5}, "prompt_tokens"),
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": 3601}, "duration_s"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 5000}, "concurrency"),
        ({"concurrency": None, "request_rate": 0}, "request_rate"),
        ({"concurrency": None}, "concurrency"),  # neither shape
        ({"request_rate": 2.0}, "concurrency"),  # both shapes
        ({"prompt_tokens": 250, "output_tokens": 10}, "prompt_tokens"),  # > max_model_len 256
        ({"max_requests": 0}, "max_requests"),
        ({"seed": -1}, "seed"),
        ({"duration_s": "soon"}, "duration_s"),
    ],
)
def test_bad_params_are_422_naming_the_field(operator_client, deployment, change, field):
    resp = post(operator_client, "tiny", {**GOOD, **change})
    assert resp.status_code == 422, resp.content
    assert resp.json()["field"] == field
    assert not BenchmarkRun.objects.exists()


def test_no_ready_replica_is_409_and_unknown_deployment_404(operator_client, db):
    cold = make_deployment("cold", **BENCH)
    make_replica(cold, node=make_node("cold-node"), state="loading")
    resp = post(operator_client, "cold", GOOD)
    assert resp.status_code == 409 and "no ready replica" in resp.json()["message"]
    assert post(operator_client, "nope", GOOD).status_code == 404


def test_replicas_on_simulated_nodes_are_not_loaded(operator_client, deployment):
    """A simulated engine (make demo) reports ready with nothing on its port: a run does not
    count it as a target, and a deployment with only those is a 409 that says so."""
    from console.deployments.models import Replica
    from console.inventory.models import Node

    Node.objects.filter(replicas__deployment=deployment).update(simulated=True)
    assert services.ready_replicas(deployment) == []
    resp = post(operator_client, "tiny", GOOD)
    assert resp.status_code == 409 and "SIMULATED" in resp.json()["message"]
    assert Replica.objects.filter(deployment=deployment, state="ready").exists()


def test_a_second_run_while_one_is_active_is_409(operator_client, deployment):
    assert post(operator_client, "tiny", GOOD).status_code == 201
    resp = post(operator_client, "tiny", GOOD)
    assert resp.status_code == 409 and "already" in resp.json()["message"]


def test_execute_runs_the_load_and_stores_results(operator_client, deployment, fake_engine):
    run_id = post(operator_client, "tiny", {**GOOD, "duration_s": 2}).json()["id"]
    assert services.execute_run(run_id) == "succeeded"
    run = BenchmarkRun.objects.get(pk=run_id)
    assert run.status == "succeeded" and run.finished_at and run.started_at
    assert run.requests == len(fake_engine.requests) > 0 and run.errors == 0
    assert run.ttft_p50_ms >= 50 and run.itl_p50_ms >= 10 and run.output_tokens_per_s > 0
    assert run.targets[0]["url"] == f"http://127.0.0.1:{fake_engine.port}"
    key = engine_api_key(deployment.replica_set.get().pk)
    assert fake_engine.auth == {p: {f"Bearer {key}"} for p in ("/tokenize", "/v1/completions")}
    assert key not in json.dumps(run.targets) and key not in json.dumps(run.engine_settings)
    assert sum(run.timeline["requests"]) == run.requests
    assert services.execute_run(run_id) == "skipped"  # a redelivered task does nothing
    detail = operator_client.get(f"/api/v1/benchmarks/{run_id}").json()
    assert detail["timeline"]["t"] and detail["req_per_s"] == run.req_per_s


def test_a_run_where_every_request_fails_is_failed_with_the_reason(operator_client, db):
    make_deployment("dead", ports=[closed_port()], **BENCH)  # nothing listens there
    run_id = post(operator_client, "dead", GOOD).json()["id"]
    assert services.execute_run(run_id) == "failed"
    run = BenchmarkRun.objects.get(pk=run_id)
    assert run.errors > 0 and "no request succeeded" in run.reason and "Connect" in run.reason


def test_cancel_a_queued_run_then_again_is_409(operator_client, deployment):
    run_id = post(operator_client, "tiny", GOOD).json()["id"]
    resp = operator_client.post(f"/api/v1/benchmarks/{run_id}/cancel")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert "otto" in resp.json()["reason"]
    assert operator_client.post(f"/api/v1/benchmarks/{run_id}/cancel").status_code == 409
    assert services.execute_run(run_id) == "skipped"
    assert AuditEntry.objects.filter(action="benchmark.cancel").count() == 1


@pytest.mark.django_db(transaction=True)
def test_cancel_stops_a_running_run_within_seconds(operator, fake_engine):
    from tests.helpers import client_for

    make_deployment("tiny", ports=[fake_engine.port], **BENCH)
    client = client_for(operator)
    run_id = post(client, "tiny", {**GOOD, "duration_s": 60}).json()["id"]

    def execute() -> None:
        try:
            services.execute_run(run_id)
        finally:
            connection.close()  # this thread's own connection (PostgreSQL drops the db after)

    worker = threading.Thread(target=execute)
    worker.start()
    wait_for(
        lambda: BenchmarkRun.objects.get(pk=run_id).requests > 0, 20, message="progress written"
    )
    assert client.post(f"/api/v1/benchmarks/{run_id}/cancel").status_code == 200
    worker.join(10)
    assert not worker.is_alive(), "the run did not stop after the cancel"
    run = BenchmarkRun.objects.get(pk=run_id)
    assert run.status == "cancelled" and run.requests > 0 and run.ttft_p50_ms is not None
    assert run.elapsed_s < 30


def test_sweep_fails_runs_whose_worker_went_silent_and_old_queued_runs(deployment):
    now = timezone.now()
    base = {"deployment": deployment, "prompt_tokens": 1, "output_tokens": 1}
    stale = BenchmarkRun.objects.create(
        **base,
        concurrency=1,
        duration_s=60,
        status="running",
        heartbeat_at=now - timedelta(seconds=services.STALE_AFTER_S + 5),
    )
    alive = BenchmarkRun.objects.create(
        **base, concurrency=1, duration_s=60, status="running", heartbeat_at=now
    )
    lost = BenchmarkRun.objects.create(
        **base,
        concurrency=1,
        duration_s=60,
        created_at=now - timedelta(seconds=services.QUEUED_TOO_LONG_S + 5),
    )
    assert services.sweep_stale_runs() == 2
    assert services.sweep_stale_runs() == 0  # idempotent
    stale.refresh_from_db(), alive.refresh_from_db(), lost.refresh_from_db()
    assert stale.status == "failed" and "stopped reporting" in stale.reason
    assert lost.status == "failed" and "no console worker" in lost.reason
    assert alive.status == "running"


def test_compare_shows_metric_deltas_and_the_settings_that_changed(viewer_client, deployment):
    base = {"deployment": deployment, "prompt_tokens": 16, "output_tokens": 4, "duration_s": 5}
    a = BenchmarkRun.objects.create(
        **base,
        concurrency=4,
        status="succeeded",
        req_per_s=10.0,
        ttft_p99_ms=200.0,
        engine_settings={"max_num_seqs": 4, "dtype": "auto"},
    )
    b = BenchmarkRun.objects.create(
        **base,
        concurrency=8,
        status="succeeded",
        req_per_s=15.0,
        ttft_p99_ms=300.0,
        engine_settings={"max_num_seqs": 16, "dtype": "auto"},
    )
    resp = viewer_client.get(f"/api/v1/benchmarks/compare?a={a.pk}&b={b.pk}")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    metrics = {m["key"]: m for m in body["metrics"]}
    assert metrics["req_per_s"]["delta"] == 5.0 and metrics["req_per_s"]["delta_pct"] == 50.0
    assert metrics["req_per_s"]["better"] is True and metrics["ttft_p99_ms"]["better"] is False
    assert metrics["itl_p50_ms"]["delta"] is None
    assert body["settings_diff"] == [{"key": "max_num_seqs", "a": 4, "b": 16}]
    assert body["params_diff"] == [{"key": "concurrency", "a": 4, "b": 8}]
    missing = viewer_client.get(f"/api/v1/benchmarks/compare?a={a.pk}&b=999999")
    assert missing.status_code == 404 and missing.json()["field"] == "b"
    assert viewer_client.get("/api/v1/benchmarks/compare?a=x&b=1").status_code == 422
