"""The inventory API: filters, pagination, labels, drain/maintenance, isolate/release."""

from __future__ import annotations

import pytest

from console.accounts.models import AuditEntry
from console.inventory.models import Accelerator, Node
from tests.factories import make_node


def test_list_nodes_filters_and_paginates(viewer_client):
    make_node("a1", labels={"zone": "z1"}, npus=2)
    make_node("a2", status="offline")
    make_node("b3", labels={"zone": "z2", "npu.model": "910b3"}, simulated=True)
    body = viewer_client.get("/api/v1/nodes?limit=2").json()
    assert body["count"] == 3
    assert [n["name"] for n in body["items"]] == ["a1", "a2"]
    assert body["items"][0]["accelerator_count"] == 2
    page2 = viewer_client.get("/api/v1/nodes?limit=2&offset=2").json()
    assert [n["name"] for n in page2["items"]] == ["b3"]

    def names(query):
        return [n["name"] for n in viewer_client.get(f"/api/v1/nodes?{query}").json()["items"]]

    assert names("status=offline") == ["a2"]
    assert names("label=zone=z1") == ["a1"]
    assert names("label=npu.model=910b3") == ["b3"]
    assert names("label=zone") == ["a1", "b3"]
    assert names("simulated=true") == ["b3"]
    assert names("q=a2") == ["a2"]


def test_node_detail_lists_its_accelerators(viewer_client):
    make_node("n1", npus=3)
    body = viewer_client.get("/api/v1/nodes/n1").json()
    assert body["arch"] == "aarch64"
    assert [a["npu_id"] for a in body["accelerators"]] == [0, 1, 2]
    assert viewer_client.get("/api/v1/nodes/nope").status_code == 404


def test_set_labels_replaces_them_and_is_audited(operator_client):
    make_node("n1", labels={"old": "x"})
    resp = operator_client.put(
        "/api/v1/nodes/n1/labels",
        {"labels": {"zone": "z1"}},
        content_type="application/json",
        REMOTE_ADDR="10.1.2.3",
    )
    assert resp.status_code == 200, resp.content
    assert Node.objects.get(name="n1").labels == {"zone": "z1"}
    entry = AuditEntry.objects.get(action="node.set_labels")
    assert (entry.actor, entry.remote_addr) == ("otto", "10.1.2.3")
    assert entry.before == {"labels": {"old": "x"}} and entry.after == {"labels": {"zone": "z1"}}


@pytest.mark.parametrize(
    "labels, field",
    [
        ({"Bad Key": "x"}, "labels.Bad Key"),
        ({"zone": "has space"}, "labels.zone"),
        ({"k" * 70: "v"}, "labels." + "k" * 70),
    ],
)
def test_bad_labels_are_refused_with_the_field(operator_client, labels, field):
    make_node("n1")
    resp = operator_client.put(
        "/api/v1/nodes/n1/labels", {"labels": labels}, content_type="application/json"
    )
    assert resp.status_code == 422
    assert resp.json()["field"] == field
    assert Node.objects.get(name="n1").labels == {}


def test_drain_maintenance_activate_cycle(operator_client):
    make_node("n1")

    def act(action):
        return operator_client.post(
            "/api/v1/nodes/n1/state",
            {"action": action, "reason": "r"},
            content_type="application/json",
        )

    assert act("drain").json()["status"] == "draining"
    assert act("maintenance").json()["status"] == "maintenance"
    assert act("activate").json()["status"] == "online"
    assert AuditEntry.objects.filter(action="node.status").count() == 3
    assert act("explode").status_code == 422


def test_drain_of_an_offline_node_keeps_it_offline_but_remembers(operator_client):
    make_node("n1", status="offline")
    body = operator_client.post(
        "/api/v1/nodes/n1/state", {"action": "drain"}, content_type="application/json"
    ).json()
    assert (body["status"], body["admin_state"]) == ("offline", "draining")


def test_isolate_needs_a_reason_and_release_clears_it(operator_client):
    node = make_node("n1", npus=1)
    acc = node.accelerators.get()
    url = f"/api/v1/accelerators/{acc.pk}"
    missing = operator_client.post(
        f"{url}/isolate", {"reason": ""}, content_type="application/json"
    )
    assert missing.status_code == 422 and missing.json()["field"] == "reason"
    ok = operator_client.post(
        f"{url}/isolate", {"reason": "ECC errors"}, content_type="application/json"
    )
    assert ok.json()["isolated"] is True
    assert Accelerator.objects.get(pk=acc.pk).isolation_reason == "ECC errors"
    operator_client.post(
        f"{url}/release", {"reason": "card replaced"}, content_type="application/json"
    )
    assert Accelerator.objects.get(pk=acc.pk).isolated is False
    assert list(
        AuditEntry.objects.filter(object_type="inventory.accelerator").values_list(
            "action", flat=True
        )
    ) == ["accelerator.release", "accelerator.isolate"]


def test_accelerator_filters(viewer_client):
    node = make_node("n1", npus=2)
    Accelerator.objects.filter(node=node, npu_id=1).update(health="Warning", model_name="310P3")

    def ids(q):
        return [a["npu_id"] for a in viewer_client.get(f"/api/v1/accelerators?{q}").json()["items"]]

    assert ids("node=n1") == [0, 1]
    assert ids("health=Warning") == [1]
    assert ids("model=910b3") == [0]
    assert viewer_client.get("/api/v1/accelerators?health=Great").status_code == 422
