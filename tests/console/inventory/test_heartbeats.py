"""Heartbeat ingest: registration behind enrollment, coalesced writes, offline and back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.inventory.enrollment import create_enrollment_token
from console.inventory.heartbeats import SEEN_KEY, ingest_heartbeat, mark_offline
from console.inventory.models import Accelerator, Node


@pytest.fixture
def enroll(admin_user, hot):
    """kp-01 enrolled (its node row exists, as enrollment creates it); the raw token."""
    from console.inventory.models import EnrollmentToken
    from tests.node_support import enroll_node

    _, raw = create_enrollment_token(actor=Actor(user=admin_user, name="ada"), name="fleet")
    enroll_node("kp-01", EnrollmentToken.objects.get())
    return raw


def ingest(payload: dict, **kwargs):
    """A beat as the inbox hands it over: from the node its signature proved."""
    return ingest_heartbeat(payload, node=payload["node"], **kwargs)


def beat(
    token: str,
    node: str = "kp-01",
    *,
    at: datetime | None = None,
    health: str = "OK",
    chips: int = 2,
    **extra,
):
    at = at or datetime.now(UTC)
    payload = {
        "node": node,
        "enroll_token": token,
        "sent_at": at.isoformat(),
        "seq": 1,
        "simulated": False,
        "host": {
            "hostname": f"{node}.dc",
            "arch": "aarch64",
            "cpu_model": "Kunpeng 920",
            "cpu_cores": {"logical": 192, "physical": 192},
            "memory_total_mb": 1_048_576,
            "os": "openEuler 22.03",
            "kernel": "5.10",
        },
        "versions": {"npu_driver": "24.1.rc2", "cann_toolkit": "8.1.RC1"},
        "chips": [
            {
                "npu_id": i,
                "chip_id": 0,
                "name": "910B3",
                "health": health if i == 0 else "OK",
                "aicore_percent": 10.0 * i,
                "hbm_used_mb": 3000,
                "hbm_total_mb": 65536,
                "temperature_c": 45,
                "power_w": 90.5,
                "bus_id": f"0000:C{i}:00.0",
            }
            for i in range(chips)
        ],
    }
    payload.update(extra)
    return payload


@pytest.mark.django_db
def test_first_beat_fills_in_the_enrolled_node_and_its_chips(enroll):
    node_id = ingest(beat(enroll))
    node = Node.objects.get(pk=node_id)
    assert (node.name, node.arch, node.status, node.cann_version) == (
        "kp-01",
        "aarch64",
        "online",
        "8.1.RC1",
    )
    assert node.enrolled_with is not None and node.cpu_cores == 192
    assert list(node.accelerators.values_list("npu_id", "model_name", "hbm_total_mb")) == [
        (0, "910B3", 65536),
        (1, "910B3", 65536),
    ]
    assert AuditEntry.objects.filter(action="node.register", object_id=str(node.pk)).exists()


@pytest.mark.django_db
def test_a_beat_names_only_the_node_that_signed_it(enroll):
    from console.inventory.heartbeats import HeartbeatRejected

    with pytest.raises(HeartbeatRejected, match="kp-02 sent a heartbeat as kp-01"):
        ingest_heartbeat(beat(enroll), node="kp-02")
    with pytest.raises(HeartbeatRejected, match="not registered"):
        ingest(beat(enroll, node="kp-99"))
    assert ingest_heartbeat({"node": "Bad Name!"}, node="Bad Name!") is None
    assert list(Node.objects.values_list("name", "last_heartbeat")) == [("kp-01", None)]


@pytest.mark.django_db
def test_unchanged_beats_do_not_write_to_the_database(enroll, django_assert_max_num_queries):
    t0 = datetime.now(UTC)
    ingest(beat(enroll, at=t0), received_at=t0)
    for i in range(1, 6):
        t = t0 + timedelta(seconds=5 * i)
        with django_assert_max_num_queries(0):
            ingest(beat(enroll, at=t), received_at=t)


@pytest.mark.django_db
def test_health_change_reaches_the_database(enroll):
    t0 = datetime.now(UTC)
    ingest(beat(enroll, at=t0), received_at=t0)
    ingest(beat(enroll, health="Alarm"), received_at=t0 + timedelta(seconds=5))
    assert Accelerator.objects.get(npu_id=0).health == "Alarm"


@pytest.mark.django_db
def test_offline_after_three_missed_beats_and_online_on_the_next(enroll, settings):
    settings.HEARTBEAT_INTERVAL_S = 5
    t0 = datetime.now(UTC)
    ingest(beat(enroll, at=t0), received_at=t0)
    assert mark_offline(now=t0 + timedelta(seconds=14)) == []
    assert mark_offline(now=t0 + timedelta(seconds=16)) == ["kp-01"]
    node = Node.objects.get(name="kp-01")
    assert node.status == "offline" and "no heartbeat for 16s" in node.status_reason
    assert mark_offline(now=t0 + timedelta(seconds=30)) == []  # one event, not one per check

    t1 = t0 + timedelta(seconds=40)
    ingest(beat(enroll, at=t1), received_at=t1)
    assert Node.objects.get(name="kp-01").status == "online"
    actions = list(
        AuditEntry.objects.filter(action="node.status")
        .order_by("time")
        .values_list("after", flat=True)
    )
    # enrolled offline, online at its first beat, then the missed beats and the return
    assert [a["status"] for a in actions] == ["online", "offline", "online"]


@pytest.mark.django_db
def test_a_drained_node_returns_drained(enroll, operator):
    from console.inventory.services import set_node_state

    t0 = datetime.now(UTC)
    ingest(beat(enroll, at=t0), received_at=t0)
    set_node_state(actor=Actor(user=operator, name="otto"), name="kp-01", action="drain")
    mark_offline(now=t0 + timedelta(seconds=60))
    assert Node.objects.get(name="kp-01").status == "offline"
    ingest(beat(enroll), received_at=t0 + timedelta(seconds=65))
    assert Node.objects.get(name="kp-01").status == "draining"


@pytest.mark.django_db
def test_node_that_never_beat_since_restart_goes_offline_from_its_db_time(hot):
    from tests.factories import make_node

    make_node("stale", last_heartbeat=datetime.now(UTC) - timedelta(minutes=5))
    hot.delete(SEEN_KEY)
    assert mark_offline() == ["stale"]


@pytest.mark.django_db
def test_a_chip_crossing_85_c_opens_one_over_temperature_incident(enroll):
    from console.diagnosis.models import Incident

    t0 = datetime.now(UTC)
    ingest(beat(enroll, at=t0), received_at=t0)
    hot = beat(enroll)
    hot["chips"][1]["temperature_c"] = 91
    for i in range(1, 4):  # stays hot for three beats: one incident, not three
        ingest(hot, received_at=t0 + timedelta(seconds=5 * i))
    incident = Incident.objects.get(category="over-temperature")
    assert incident.count == 1 and "1.0" in incident.fingerprint
