"""Heartbeats that are too big or malformed are refused whole; a node's address is an IP
address (inside NODE_ADDRESS_CIDRS when set), and a changed one waits for an admin."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from ipaddress import ip_network

import pytest

from console.accounts.models import AuditEntry
from console.hot import get_redis
from console.inventory import heartbeats
from console.inventory.heartbeats import HeartbeatRejected, engines_key, ingest_heartbeat
from console.inventory.models import Accelerator, Node
from tests.factories import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def hot(redis_url):
    r = get_redis()

    def clean():
        keys = list(r.scan_iter("npc:*"))
        if keys:
            r.delete(*keys)
        heartbeats._node_ids.clear()

    clean()
    yield r
    clean()


def beat(node: str = "kp-01", *, address: str = "10.0.0.1", chips: int = 2, **extra) -> dict:
    return {
        "node": node,
        "enroll_token": "npe_" + "x" * 20,  # ignored once the contract drops it
        "sent_at": datetime.now(UTC).isoformat(),
        "host": {"hostname": f"{node}.dc", "address": address, "arch": "aarch64"},
        "chips": [
            {"npu_id": i, "name": "910B3", "health": "OK", "temperature_c": 45}
            for i in range(chips)
        ],
        **extra,
    }


def ingest(payload: dict, at: datetime | None = None) -> int | None:
    return ingest_heartbeat(payload, node=payload["node"], received_at=at or datetime.now(UTC))


def engine(**fields) -> dict:
    now = datetime.now(UTC).isoformat()
    return {"node": "kp-01", "replica_id": 7, "generation": 1, "phase": "ready", "at": now} | fields


# --- refused payloads -------------------------------------------------------------------------
def test_a_beat_with_1000_chips_is_refused_and_opens_no_incident():
    from console.diagnosis.models import Incident

    make_node("kp-01", address="")
    payload = beat(chips=1000)
    for chip in payload["chips"]:
        chip.update(health="Critical", temperature_c=99)
    assert ingest(payload) is None
    assert not Incident.objects.exists() and not Accelerator.objects.exists()


@pytest.mark.parametrize(
    "bad",
    [
        engine(metrics={"num_requests_running": "lots"}),
        engine(metrics={"num_requests_running": -3}),
        {k: v for k, v in engine().items() if k != "replica_id"},
    ],
)
def test_a_bad_engine_entry_refuses_the_beat_and_stores_nothing(hot, bad):
    make_node("kp-01", address="10.0.0.1")
    assert ingest(beat(engines=[engine(replica_id=8), bad])) is None
    assert hot.get(engines_key("kp-01")) is None


def test_engines_are_stored_as_validated_reports(hot):
    from console.deployments.engines import engine_metrics

    make_node("kp-01", address="10.0.0.1")
    assert ingest(beat(engines=[engine(metrics={"num_requests_running": 2}, extra="x")]))
    stored = json.loads(hot.get(engines_key("kp-01")))
    assert [(e["replica_id"], e["phase"]) for e in stored] == [(7, "ready")]
    assert "extra" not in stored[0]
    assert engine_metrics([7])[7]["num_requests_running"] == 2.0


@pytest.mark.parametrize(
    "address", ["127.0.0.1:9/evil?x=", "kp-01.example.com", "::1 ", "http://10.0.0.9"]
)
def test_an_address_that_is_not_an_ip_address_refuses_the_beat(address, caplog):
    make_node("kp-01", address="10.0.0.1")
    assert ingest(beat(address=address)) is None
    assert Node.objects.get(name="kp-01").address == "10.0.0.1"
    assert "host.address" in caplog.text


def test_an_ipv6_address_is_stored_in_canonical_form():
    make_node("kp-01", address="")
    assert ingest(beat(address="2001:DB8:0:0::0:1"))
    assert Node.objects.get(name="kp-01").address == "2001:db8::1"


def test_an_address_outside_node_address_cidrs_is_refused(settings):
    settings.NODE_ADDRESS_CIDRS = [ip_network("10.20.0.0/16"), ip_network("fd00::/8")]
    make_node("kp-01", address="")
    with pytest.raises(HeartbeatRejected, match="outside NODE_ADDRESS_CIDRS"):
        ingest(beat(address="192.168.1.5"))
    assert Node.objects.get(name="kp-01").address == ""
    assert ingest(beat(address="10.20.3.4"))
    assert ingest(beat(address="fd00::5"))
    assert ingest(beat(address=""))  # the agent found none: nothing to store, not refused


# --- address changes --------------------------------------------------------------------------
def pending_events(node: Node) -> list[dict]:
    entries = AuditEntry.objects.filter(action="node.address_pending", object_id=str(node.pk))
    return list(entries.values_list("after", flat=True))


def test_the_first_address_is_taken_without_asking():
    node = make_node("kp-01", address="")
    ingest(beat(address="10.0.0.7"))
    node.refresh_from_db()
    assert (node.address, node.pending_address, pending_events(node)) == ("10.0.0.7", "", [])


def test_an_address_change_waits_for_an_admin_and_is_journaled_once(
    django_assert_max_num_queries,
):
    node = make_node("kp-01", address="10.0.0.1")
    t0 = datetime.now(UTC)
    ingest(beat(address="10.0.0.1"), t0)
    ingest(beat(address="10.0.0.2"), t0 + timedelta(seconds=5))
    for i in range(2, 12):  # the steady state with a change pending costs nothing extra
        with django_assert_max_num_queries(0):
            ingest(beat(address="10.0.0.2"), t0 + timedelta(seconds=5 * i))
    node.refresh_from_db()
    assert (node.address, node.pending_address) == ("10.0.0.1", "10.0.0.2")
    assert pending_events(node) == [{"pending_address": "10.0.0.2"}]
    ingest(beat(address="10.0.0.3"), t0 + timedelta(seconds=70))  # another one: one more event
    assert len(pending_events(node)) == 2


def test_an_admin_accepts_the_pending_address_through_the_api(admin_client_, operator_client):
    node = make_node("kp-01", address="10.0.0.1")
    ingest(beat(address="10.0.0.1"))
    ingest(beat(address="10.0.0.2"))
    url = "/api/v1/nodes/kp-01/address/accept"
    assert operator_client.post(url).status_code == 403
    node.refresh_from_db()
    assert node.address == "10.0.0.1"
    response = admin_client_.post(url)
    assert response.status_code == 200, response.content
    assert (response.json()["address"], response.json()["pending_address"]) == ("10.0.0.2", "")
    node.refresh_from_db()
    assert (node.address, node.pending_address) == ("10.0.0.2", "")
    entry = AuditEntry.objects.get(action="node.address_accept")
    assert entry.actor == "ada" and entry.before == {"address": "10.0.0.1"}
    assert admin_client_.post(url).status_code == 409  # nothing pending any more
    ingest(beat(address="10.0.0.2"))  # the host keeps reporting it: nothing new
    assert len(pending_events(node)) == 1


def test_returning_to_the_known_address_withdraws_the_pending_change():
    node = make_node("kp-01", address="10.0.0.1")
    ingest(beat(address="10.0.0.1"))
    ingest(beat(address="10.0.0.2"))
    ingest(beat(address="10.0.0.1"))
    node.refresh_from_db()
    assert (node.address, node.pending_address) == ("10.0.0.1", "")


def test_auto_accept_applies_a_change_at_once_and_records_it(settings):
    settings.NODE_ADDRESS_AUTO_ACCEPT = True
    node = make_node("kp-01", address="10.0.0.1")
    for _ in range(3):
        ingest(beat(address="10.0.0.2"))
    node.refresh_from_db()
    assert (node.address, node.pending_address) == ("10.0.0.2", "")
    changes = AuditEntry.objects.filter(action="node.address", object_id=str(node.pk))
    assert list(changes.values_list("before", "after")) == [
        ({"address": "10.0.0.1"}, {"address": "10.0.0.2"})
    ]


def test_the_node_page_shows_a_pending_change_and_the_button_to_admins_only(
    admin_client_, operator_client
):
    make_node("kp-01", address="10.0.0.1")
    ingest(beat(address="10.0.0.1"))
    ingest(beat(address="10.0.0.2"))
    page = admin_client_.get("/nodes/kp-01/").content.decode()
    assert "address change pending" in page and "10.0.0.1 → 10.0.0.2" in page
    assert 'data-testid="accept-address"' in page
    page = operator_client.get("/nodes/kp-01/").content.decode()
    assert "10.0.0.1 → 10.0.0.2" in page and 'data-testid="accept-address"' not in page
    assert operator_client.post("/nodes/kp-01/address").status_code == 403
    response = admin_client_.post("/nodes/kp-01/address")
    assert response.status_code == 302
    assert Node.objects.get(name="kp-01").address == "10.0.0.2"
