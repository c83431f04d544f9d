"""Operators acting at once, and a node dropping out while a scale is placed: no NPU is ever
held by two replicas, and what is left is one outcome some serial order would give.

Real concurrency: threads, each with its own database connection, hit the API and run the
reconcile loop at the same time. Only on PostgreSQL (row locks, concurrent transactions);
SQLite serialises every writer, so there is nothing concurrent to prove there.
Promise: docs/faults.md "Concurrent operators".
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest
from django.db import connection

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.deployments.models import HOLDS_NPUS, Deployment, NpuAllocation, Replica, ReplicaEvent
from console.deployments.reconcile import reconcile
from console.inventory.models import Node
from console.inventory.services import transition_node
from tests.helpers import client_for, make_user
from tests.kit import make_deployment, make_node, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.backend, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def postgres_only(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("true concurrency needs PostgreSQL: SQLite serialises every writer")
    monkeypatch.setattr("console.deployments.reconcile.dispatch_start", lambda r: None)
    monkeypatch.setattr("console.deployments.reconcile.dispatch_stop_replica", lambda r: None)
    monkeypatch.setattr("console.deployments.services._kick_reconcile", lambda: None)


def at_once(*jobs: Callable[[], object]) -> list[object]:
    """Run the jobs in threads released together; returns results (or the exceptions)."""
    barrier = threading.Barrier(len(jobs))
    results: list[object] = [None] * len(jobs)

    def run(i: int, job: Callable[[], object]) -> None:
        barrier.wait()
        try:
            results[i] = job()
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    return results


def npu_deployment(name: str, replicas: int) -> Deployment:
    return make_deployment(
        name,
        model_path="/models/m",
        served_model_name="m",
        device="npu",
        npus_per_replica=2,
        replicas=replicas,
        desired_state="stopped",
        spec_version=1,
    )


def assert_consistent(dep: Deployment) -> None:
    """Every chip held once, every placed replica holds exactly its chips on its own node."""
    chips = list(NpuAllocation.objects.values_list("accelerator_id", flat=True))
    assert len(chips) == len(set(chips)), "an NPU is double-booked"
    for replica in Replica.objects.filter(deployment=dep):
        held = list(replica.allocations.select_related("accelerator"))
        if replica.state in HOLDS_NPUS:
            assert len(held) == dep.npus_per_replica, (replica, replica.state, held)
            assert {a.accelerator.node_id for a in held} == {replica.node_id}
        else:
            assert not held, (replica, replica.state)


def test_two_operators_starting_one_deployment_at_once_start_it_once():
    make_node("race-a", npus=4)
    make_node("race-b", npus=4)
    dep = npu_deployment("race", replicas=2)
    ops = [client_for(make_user(f"op{i}", "operator")) for i in range(2)]
    results = at_once(
        *[lambda c=c: c.post("/api/v1/deployments/race/start").status_code for c in ops],
        reconcile,
        reconcile,
    )
    assert results[:2] == [200, 200], results
    assert not [r for r in results if isinstance(r, Exception)], results
    reconcile()  # whatever ran first, one more pass settles it
    dep.refresh_from_db()
    assert dep.desired_state == "running"
    assert_consistent(dep)
    placed = Replica.objects.filter(deployment=dep, state="scheduled")
    assert placed.count() == 2 and {r.node.name for r in placed} == {"race-a", "race-b"}
    scheduled = ReplicaEvent.objects.filter(replica__deployment=dep, to_state="scheduled")
    assert scheduled.count() == 2  # each replica started once, not once per operator
    assert AuditEntry.objects.filter(action="deployment.running").count() == 2


def test_scaling_while_a_node_goes_offline_never_double_books():
    make_node("scale-a", npus=4)
    b = make_node("scale-b", npus=4)
    dep = npu_deployment("grow", replicas=1)
    op1, op2 = (client_for(make_user(f"sc{i}", "operator")) for i in range(2))
    op1.post("/api/v1/deployments/grow/start")
    reconcile()

    def node_lost():
        node = Node.objects.get(pk=b.pk)
        return transition_node(
            node=node, to="offline", reason="no heartbeat", actor=Actor.system("test")
        )

    def scale(client, n):
        return lambda: (
            client.post(
                "/api/v1/deployments/grow/scale", {"replicas": n}, content_type="application/json"
            ).status_code
        )

    results = at_once(scale(op1, 4), scale(op2, 3), node_lost, reconcile, reconcile)
    assert results[:3] == [200, 200, True], results
    assert not [r for r in results if isinstance(r, Exception)], results
    for _ in range(2):
        reconcile()
    dep.refresh_from_db()
    last = AuditEntry.objects.filter(action="deployment.scale").order_by("-time", "-pk").first()
    assert dep.replicas == last.after["replicas"]  # the scale committed last is what holds
    assert dep.desired_state == "running"
    assert_consistent(dep)
    on_b = set(Replica.objects.filter(deployment=dep, node=b).values_list("state", flat=True))
    assert on_b <= {"unknown"}, on_b  # kept, not stopped: the engine may still be serving
    on_a = Replica.objects.filter(deployment=dep, node__name="scale-a", state__in=HOLDS_NPUS)
    assert on_a.count() == 2  # four NPUs on scale-a, two per replica: full, never over
    waiting = Replica.objects.filter(deployment=dep, state="pending")
    assert all("waiting for capacity" in r.state_reason for r in waiting)


def test_a_scale_never_undoes_a_stop_that_committed_while_it_waited():
    make_node("order-a", npus=4)
    npu_deployment("order", replicas=1)
    stopper, scaler = (client_for(make_user(f"or{i}", "operator")) for i in range(2))
    stopper.post("/api/v1/deployments/order/start")
    s = connection.settings_dict
    dsn = dict(
        host=s.get("HOST") or "127.0.0.1",
        port=s.get("PORT") or 5432,
        user=s.get("USER") or "postgres",
        dbname=s["NAME"],
    )
    lock = psycopg.connect(**dsn)  # holds the deployment row: both requests queue behind it
    lock.execute("SELECT id FROM deployments_deployment WHERE name = 'order' FOR UPDATE")

    def waiters() -> int:
        with psycopg.connect(**dsn, autocommit=True) as c:
            return c.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                "AND wait_event_type = 'Lock'",
                [s["NAME"]],
            ).fetchone()[0]

    results: dict[str, int] = {}

    def call(key, fn):
        try:
            results[key] = fn().status_code
        finally:
            connection.close()

    stop = threading.Thread(
        target=call, args=("stop", lambda: stopper.post("/api/v1/deployments/order/stop"))
    )
    stop.start()
    wait_for(lambda: waiters() == 1, 20, message="the stop to wait for the row")
    scale = threading.Thread(
        target=call,
        args=(
            "scale",
            lambda: scaler.post(
                "/api/v1/deployments/order/scale", {"replicas": 3}, content_type="application/json"
            ),
        ),
    )
    scale.start()
    wait_for(lambda: waiters() == 2, 20, message="the scale to wait behind the stop")
    lock.rollback()  # the stop commits first, then the scale
    lock.close()
    stop.join(30)
    scale.join(30)
    assert results == {"stop": 200, "scale": 200}
    dep = Deployment.objects.get(name="order")
    assert (dep.desired_state, dep.replicas) == ("stopped", 3)
