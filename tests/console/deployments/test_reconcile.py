"""The reconcile loop repairs replicas from the engines the heartbeats reported, kept in Redis:
whatever is planted there, a bad entry is skipped and logged and scheduling goes on."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from console.accounts.services import Actor
from console.deployments import services
from console.deployments.models import Replica
from console.deployments.reconcile import reconcile, repair_from_heartbeats
from console.deployments.schemas import DeploymentIn
from console.hot import get_redis
from console.inventory.heartbeats import engines_key
from tests.console.deployments.test_scheduling import SPEC
from tests.factories import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_dispatch(monkeypatch):
    monkeypatch.setattr("console.deployments.reconcile.dispatch_start", lambda r: None)
    monkeypatch.setattr("console.deployments.reconcile.dispatch_stop_replica", lambda r: None)


@pytest.fixture
def hot(redis_url):
    r = get_redis()

    def clean():  # what applying a report leaves behind would hide the next test's reports
        keys = [*r.scan_iter("npc:engine-applied:*"), engines_key("a"), engines_key("b")]
        r.delete(*keys)

    clean()
    yield r
    clean()


def test_bad_engine_entries_in_redis_are_skipped_and_the_good_one_applied(
    operator, fake_inspect, hot, caplog
):
    make_node("a", npus=4)
    make_node("b", npus=4)
    actor = Actor(user=operator, name="otto")
    services.create_deployment(
        actor=actor, payload=DeploymentIn(name="d1", pinned_node="a", **SPEC | {"replicas": 1})
    )
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "scheduled"
    now = datetime.now(UTC).isoformat()
    good = {"replica_id": replica.pk, "generation": replica.generation, "phase": "loading"}
    planted = [
        {"generation": 1, "phase": "ready", "at": now},  # no replica_id
        {**good, "at": now, "metrics": {"num_requests_running": "lots"}},
        {**good, "at": "yesterday"},
        "not an object",
        {**good, "at": now},
    ]
    hot.set(engines_key(replica.node.name), json.dumps(planted), ex=60)
    hot.set(engines_key("b" if replica.node.name == "a" else "a"), b"{not json", ex=60)
    assert repair_from_heartbeats() == 1
    replica.refresh_from_db()
    assert replica.state == "loading"
    assert "skipping an engine report" in caplog.text
    assert "unreadable engine reports" in caplog.text
    reconcile()  # and the whole loop runs with the junk still there
