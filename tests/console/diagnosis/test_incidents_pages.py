"""Incident pages, the node doctor, the NPU journal and the incidents API."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console.accounts.models import AuditEntry
from console.diagnosis.models import Incident, IncidentNote
from console.inventory.models import Accelerator, NodeCheckRun
from tests.factories import make_node


def _incident(title="x", **fields):
    values = {
        "category": "engine-crash",
        "severity": "warning",
        "title": title,
        "fingerprint": f"fp:{title}",
        "diagnoses": [
            {
                "rule": "r1",
                "category": "engine-crash",
                "severity": "warning",
                "title": "Engine died",
                "evidence": [{"line": 2, "text": "boom"}],
                "remediation": ["Restart it", "Check the log"],
                "explanation": "It crashed.",
                "links": [],
            }
        ],
        "evidence": [
            {
                "line": 2,
                "rule": "r1",
                "context": [
                    {"n": 1, "text": "before", "hit": False},
                    {"n": 2, "text": "boom", "hit": True},
                ],
            }
        ],
    }
    values.update(fields)
    return Incident.objects.create(**values)


@pytest.mark.django_db
def test_queue_lists_open_first_then_severity_then_recent(viewer_client):
    old = timezone.now() - timezone.timedelta(hours=1)
    resolved = _incident("resolved-crit", severity="critical", status="resolved")
    info = _incident("open-info", severity="info")
    crit = _incident("open-crit", severity="critical", last_seen=old)
    acked = _incident("acked-crit", severity="critical", status="acknowledged")
    response = viewer_client.get("/incidents/")
    assert response.status_code == 200
    body = response.content.decode()
    order = [body.index(f'id="incident-{i.pk}"') for i in (crit, info, acked, resolved)]
    assert order == sorted(order)
    assert 'data-shortcut="g i"' in body and "incidents.js" in body
    assert "Acknowledge" not in body.split("<tbody>")[1]  # viewers get no action buttons


@pytest.mark.django_db
def test_queue_filters_by_status_and_category(viewer_client):
    a = _incident("a", category="port-in-use")
    b = _incident("b", status="resolved")
    body = viewer_client.get("/incidents/?category=port-in-use").content.decode()
    assert f'id="incident-{a.pk}"' in body and f'id="incident-{b.pk}"' not in body
    body = viewer_client.get("/incidents/?status=resolved").content.decode()
    assert f'id="incident-{b.pk}"' in body and f'id="incident-{a.pk}"' not in body


@pytest.mark.django_db
def test_detail_shows_diagnosis_evidence_and_remediation(viewer_client):
    incident = _incident("detail", count=3)
    body = viewer_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "Engine died" in body and "<mark>2: boom</mark>" in body
    assert "<li>Restart it</li>" in body and "3 times" in body
    assert "<time datetime=" in body


@pytest.mark.django_db
def test_viewer_cannot_act_operator_can_with_audit(viewer_client, operator_client):
    incident = _incident("act")
    assert viewer_client.post(f"/incidents/{incident.pk}/ack").status_code == 403
    assert viewer_client.post(f"/incidents/{incident.pk}/note", {"text": "x"}).status_code == 403
    assert viewer_client.post(f"/incidents/{incident.pk}/resolve").status_code == 403
    assert operator_client.post(f"/incidents/{incident.pk}/ack").status_code == 302
    operator_client.post(f"/incidents/{incident.pk}/note", {"text": "looking"})
    operator_client.post(f"/incidents/{incident.pk}/resolve")
    incident.refresh_from_db()
    assert incident.status == "resolved"
    assert IncidentNote.objects.get(incident=incident, kind="note").text == "looking"
    actions = IncidentNote.objects.filter(incident=incident, kind="action")
    assert list(actions.values_list("text", "author")) == [
        ("acknowledged", "otto"),
        ("resolved", "otto"),
    ]
    assert AuditEntry.objects.filter(object_type="diagnosis.incident").count() == 3


@pytest.mark.django_db
def test_node_doctor_shows_checks_and_polls_while_pending(viewer_client):
    node = make_node("n1")
    NodeCheckRun.objects.create(
        node=node,
        status="failed",
        results=[{"name": "driver", "ok": False, "evidence": "no driver", "fix": "install it"}],
    )
    body = viewer_client.get("/nodes/n1/doctor/").content.decode()
    assert "no driver" in body and "install it" in body and "hx-get" not in body
    NodeCheckRun.objects.create(node=node)
    response = viewer_client.get("/nodes/n1/doctor/", HTTP_HX_REQUEST="true")
    assert 'id="doctor-run"' in response.content.decode() and "hx-get" in response.content.decode()


@pytest.mark.django_db
def test_accelerator_journal_lists_audit_incidents_and_takes_notes(viewer_client, operator_client):
    node = make_node("n2", npus=1)
    acc = Accelerator.objects.get(node=node)
    incident = _incident("hot", accelerator=acc, node=node, category="over-temperature")
    assert (
        operator_client.post(
            f"/accelerators/{acc.pk}/journal/note", {"text": "reseated"}
        ).status_code
        == 302
    )
    assert (
        viewer_client.post(f"/accelerators/{acc.pk}/journal/note", {"text": "x"}).status_code == 403
    )
    body = viewer_client.get(f"/accelerators/{acc.pk}/journal/").content.decode()
    assert "reseated" in body and f"/incidents/{incident.pk}/" in body
    entry = AuditEntry.objects.get(action="accelerator.note")
    assert entry.object_type == "inventory.accelerator" and entry.object_id == str(acc.pk)


# --- API ------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_api_lists_and_reads_incidents(viewer_client):
    a = _incident("a", severity="critical")
    _incident("b", status="resolved")
    data = viewer_client.get("/api/v1/incidents?status=open").json()
    assert data["count"] == 1 and data["items"][0]["id"] == a.pk
    detail = viewer_client.get(f"/api/v1/incidents/{a.pk}").json()
    assert detail["diagnoses"][0]["rule"] == "r1" and detail["notes"] == []
    missing = viewer_client.get("/api/v1/incidents/999999")
    assert missing.status_code == 404 and missing.json()["field"] == "id"


@pytest.mark.django_db
def test_api_actions(viewer_client, operator_client):
    incident = _incident("api")
    url = f"/api/v1/incidents/{incident.pk}"
    assert viewer_client.post(f"{url}/ack").status_code == 403
    assert operator_client.post(f"{url}/ack").json()["status"] == "acknowledged"
    assert operator_client.post(f"{url}/ack").status_code == 409
    bad = operator_client.post(f"{url}/note", {"text": ""}, content_type="application/json")
    assert bad.status_code == 422 and bad.json()["field"] == "text"
    ok = operator_client.post(f"{url}/note", {"text": "hi"}, content_type="application/json")
    assert ok.status_code == 201 and ok.json()["text"] == "hi"
    assert operator_client.post(f"{url}/resolve").json()["status"] == "resolved"
    assert operator_client.post("/api/v1/incidents/999999/resolve").status_code == 404
