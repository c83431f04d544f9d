"""Engine reports are ordered by the agent's clock, never against the console's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from console.accounts.services import Actor
from console.deployments import services
from console.deployments.engines import apply_report
from console.deployments.models import Replica
from console.deployments.reconcile import reconcile
from console.deployments.schemas import DeploymentIn
from tests.console.deployments.test_scheduling import SPEC
from tests.factories import make_node


def send(replica: Replica, phase: str, at: datetime, **extra) -> None:
    apply_report(
        {
            "node": replica.node.name,
            "replica_id": replica.pk,
            "generation": replica.generation,
            "phase": phase,
            "at": at.isoformat(),
            **extra,
        },
        node=replica.node.name,
    )


def test_back_to_back_reports_from_a_host_whose_clock_is_behind_both_apply(
    operator, fake_inspect, monkeypatch
):
    monkeypatch.setattr("console.deployments.reconcile.dispatch_start", lambda r: None)
    actor = Actor(user=operator, name="otto")
    make_node("a", npus=4)
    services.create_deployment(
        actor=actor, payload=DeploymentIn(name="d1", **SPEC | {"replicas": 1})
    )
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    host_now = datetime.now(UTC) - timedelta(seconds=5)  # the host's clock is 5 s behind
    send(replica, "starting", host_now)
    send(replica, "failed", host_now + timedelta(seconds=1), reason="killed by signal 9")
    send(replica, "crash-loop", host_now + timedelta(seconds=1.01), reason="5 crash(es)")
    replica.refresh_from_db()
    assert replica.state == "crash-loop"
    send(replica, "starting", host_now + timedelta(seconds=0.5))  # a late heartbeat snapshot
    replica.refresh_from_db()
    assert replica.state == "crash-loop"
