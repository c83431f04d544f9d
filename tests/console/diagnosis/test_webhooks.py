"""Incident webhooks: timestamped signatures, URLs and secrets kept out of logs, the payload,
re-notify intervals for folded repeats, endpoints managed through services, API and pages.

`Receiver` is a real HTTP server on port 0 that checks each delivery's signature with the
shipped verification function (console/diagnosis/webhook_signing.verify)."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models import F
from django.utils import timezone

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.diagnosis import incidents, webhook_services, webhooks
from console.diagnosis.models import Incident, WebhookEndpoint, WebhookNotice
from console.diagnosis.tasks import send_webhook
from console.diagnosis.webhook_signing import signature_header, verify
from console.errors import Forbidden, Invalid
from tests.helpers import make_user
from tests.kit import closed_port, make_deployment, make_node, make_replica
from workers.contracts import JOBS_QUEUE

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "engine"
TOKEN = "T0KEN-in-the-path-9f8e7d"
SECRET = "whsec-correct-horse-battery-staple"


# --- the receiver -----------------------------------------------------------------------------
@dataclass
class Delivery:
    path: str
    headers: dict
    body: bytes
    verified: bool | None  # the signature checked with the receiver's secret; None: no secret

    @property
    def json(self) -> dict:
        return json.loads(self.body)


class Receiver:
    """A webhook receiver on 127.0.0.1:<port 0>. `answers`: statuses to answer in turn (then
    200); `secret`: verify each delivery's signature with it (webhook_signing.verify)."""

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        self.answers: list[int] = []
        self.received: list[Delivery] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                verified = None
                if receiver.secret is not None:
                    verified = verify(
                        body,
                        headers.get("x-npu-console-signature", ""),
                        receiver.secret,
                        now=time.time(),
                    )
                receiver.received.append(Delivery(self.path, headers, body, verified))
                status = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str = f"/hooks/{TOKEN}") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    with Receiver(secret=SECRET) as r:
        yield r


@pytest.fixture
def no_env_webhook(monkeypatch):
    monkeypatch.delenv("INCIDENT_WEBHOOK_URL", raising=False)
    monkeypatch.delenv("INCIDENT_WEBHOOK_SECRET", raising=False)


def _admin() -> Actor:
    user = make_user("ada-hooks", "admin")
    return Actor(user=user, name=user.username)


def _endpoint(url: str, name: str = "oncall", **fields) -> WebhookEndpoint:
    values = {"secret": SECRET, "min_severity": "info", "renotify_minutes": 30}
    values.update(fields)
    return WebhookEndpoint.objects.create(name=name, url=url, **values)


def _chip_incident(**fields) -> Incident:
    node = make_node(name="node-a", npus=4)
    acc = node.accelerators.get(npu_id=3)
    values = {
        "category": "hbm-ecc",
        "severity": "critical",
        "title": "NPU health Alarm on node-a NPU 3.0",
        "fingerprint": "npu:node-a:3.0:npu-health",
        "node": node,
        "accelerator": acc,
        "subject": "node-a NPU 3.0",
        "diagnoses": [
            {
                "rule": "hbm-ecc-multi-bit",
                "category": "hbm-ecc",
                "severity": "critical",
                "title": "HBM ECC errors",
                "confidence": "high",
                "remediation": ["Drain the node", "Replace the NPU (RMA)"],
            }
        ],
    }
    values.update(fields)
    return Incident.objects.create(**values)


def _fold(incident: Incident, now) -> None:
    """What incidents._open_or_fold does to a repeat, then the dispatch it makes, at `now`."""
    Incident.objects.filter(pk=incident.pk).update(count=F("count") + 1, last_seen=now)
    webhooks.dispatch(incident.pk, "folded", now=now)


def _run_queued(sent: list) -> None:
    for args in sent:
        send_webhook.apply(args=args)


@pytest.fixture
def sent(monkeypatch):
    """The deliveries dispatch queues (args of each diagnosis.send_webhook), once committed."""
    from console.celery import app

    calls: list = []

    def send_task(name, args, queue, **kw):
        assert name == "diagnosis.send_webhook" and queue == JOBS_QUEUE
        calls.append(args)

    monkeypatch.setattr(app, "send_task", send_task)
    return calls


# --- 1. timestamped signatures ----------------------------------------------------------------
def test_verify_accepts_a_fresh_signature_and_refuses_replays_tampering_and_wrong_secrets():
    body = b'{"event":"opened"}'
    header = signature_header(body, SECRET, 1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify(body, header, SECRET, now=1_700_000_000 + 299)
    assert not verify(body, header, SECRET, now=1_700_000_000 + 301)  # a replay, 5 min later
    assert not verify(body, header, SECRET, now=1_700_000_000 - 301)
    assert not verify(body + b" ", header, SECRET, now=1_700_000_000)
    assert not verify(body, header, "another-secret-000000", now=1_700_000_000)
    # the timestamp is signed: moving it to a fresh time breaks the signature
    moved = header.replace("t=1700000000", "t=1700000900")
    assert not verify(body, moved, SECRET, now=1_700_000_900)
    # a sender rotating its secret signs with both; either verifies
    both = f"{header},v1={signature_header(body, 'old-secret-0000000', 1_700_000_000)[17:]}"
    assert verify(body, both, SECRET, now=1_700_000_000)
    assert not verify(body, "sha256=abc", SECRET, now=1_700_000_000)


@pytest.mark.django_db
def test_delivery_is_signed_over_timestamp_and_body(
    receiver, no_env_webhook, sent, django_capture_on_commit_callbacks
):
    _endpoint(receiver.url())
    incident = _chip_incident()
    with django_capture_on_commit_callbacks(execute=True):
        webhooks.dispatch(incident.pk, "opened")
        assert sent == []  # nothing is queued before the transaction commits
    _run_queued(sent)
    [delivery] = receiver.received
    stamp = int(delivery.headers["x-npu-console-timestamp"])
    assert abs(time.time() - stamp) < 60
    assert delivery.headers["x-npu-console-signature"] == signature_header(
        delivery.body, SECRET, stamp
    )
    assert delivery.verified is True


# --- 2. the URL and the secret are never logged ---------------------------------------------
class _Silent:
    """A TCP port that accepts connections and never answers: the POST times out."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        return self

    def __exit__(self, *exc):
        self.sock.close()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]


def _assert_nothing_secret_logged(caplog, endpoint: WebhookEndpoint) -> None:
    texts = [caplog.text]
    for record in caplog.records:
        texts.append(record.getMessage())
        texts.append(repr(record.args))
        if record.exc_info:
            texts.append(logging.Formatter().formatException(record.exc_info))
    blob = "\n".join(texts)
    for secret in (endpoint.url, TOKEN, SECRET, f"127.0.0.1:{endpoint.url.split(':')[2]}"):
        assert secret not in blob
    endpoint.refresh_from_db()
    assert TOKEN not in endpoint.last_error and "127.0.0.1" not in endpoint.last_error


@pytest.mark.django_db
@pytest.mark.parametrize("answer", [500, 404, 302])
def test_failed_delivery_logs_the_endpoint_name_and_status_never_the_url(
    receiver, no_env_webhook, caplog, answer
):
    caplog.set_level(logging.DEBUG)
    endpoint = _endpoint(receiver.url(), name="pager-main")
    incident = _chip_incident()
    receiver.answers = [answer] * 10
    send_webhook.apply(args=[incident.pk, "opened", str(endpoint.pk), 0])
    warnings = [r.getMessage() for r in caplog.records if r.name == "console.diagnosis.webhooks"]
    assert any("pager-main" in m and f"HTTP {answer}" in m for m in warnings)
    _assert_nothing_secret_logged(caplog, endpoint)
    endpoint.refresh_from_db()
    assert endpoint.last_status == answer


@pytest.mark.django_db
def test_a_redirect_is_not_followed(receiver, no_env_webhook):
    endpoint = _endpoint(receiver.url())
    receiver.answers = [302]
    assert webhooks.deliver(_chip_incident().pk, "opened", str(endpoint.pk)) == 302
    assert len(receiver.received) == 1


@pytest.mark.django_db
def test_connection_refused_names_the_endpoint_never_the_url(no_env_webhook, caplog):
    caplog.set_level(logging.DEBUG)
    endpoint = _endpoint(f"http://127.0.0.1:{closed_port()}/hooks/{TOKEN}", name="pager-main")
    incident = _chip_incident()
    with pytest.raises(webhooks.RetryableError) as err:
        webhooks.deliver(incident.pk, "opened", str(endpoint.pk))
    assert str(err.value) == "webhook pager-main: connection refused"
    send_webhook.apply(args=[incident.pk, "opened", str(endpoint.pk), 0])  # with its retries
    _assert_nothing_secret_logged(caplog, endpoint)
    endpoint.refresh_from_db()
    assert endpoint.last_status is None and endpoint.last_error == "connection refused"


@pytest.mark.django_db
def test_a_timeout_names_the_endpoint_never_the_url(no_env_webhook, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(webhooks, "TIMEOUT_S", 0.3)
    with _Silent() as silent:
        endpoint = _endpoint(f"http://127.0.0.1:{silent.port}/hooks/{TOKEN}", name="slow-one")
        with pytest.raises(webhooks.RetryableError) as err:
            webhooks.deliver(_chip_incident().pk, "opened", str(endpoint.pk))
    assert str(err.value) == "webhook slow-one: timed out"
    assert any("slow-one" in r.getMessage() for r in caplog.records)
    _assert_nothing_secret_logged(caplog, endpoint)


# --- 3. the payload -----------------------------------------------------------------------------
@pytest.mark.django_db
def test_payload_has_subject_absolute_url_where_diagnosis_remedy_and_counts(
    receiver, no_env_webhook, settings
):
    settings.PUBLIC_URL = "https://console.example.com"
    endpoint = _endpoint(receiver.url())
    incident = _chip_incident(count=4)
    webhooks.deliver(incident.pk, "folded", str(endpoint.pk), 3)
    data = receiver.received[0].json
    assert data["event"] == "folded"
    assert data["subject"] == "[critical] npu-3 on node-a: HBM ECC errors"
    assert data["url"] == f"https://console.example.com/incidents/{incident.pk}/"
    assert data["incident"]["url"] == data["url"]
    assert data["incident"]["id"] == incident.pk and data["incident"]["severity"] == "critical"
    assert data["node"] == "node-a"
    assert data["npu"] == {"npu_id": 3, "chip_id": 0}
    assert data["diagnosis"]["title"] == "HBM ECC errors"
    assert data["diagnosis"]["remedy"] == ["Drain the node", "Replace the NPU (RMA)"]
    assert data["counts"] == {"occurrences": 4, "repeats": 3}
    assert data["text"].startswith(data["subject"]) and data["url"] in data["text"]


@pytest.mark.django_db
def test_payload_of_an_engine_crash_names_the_replica(
    receiver, no_env_webhook, sent, django_capture_on_commit_callbacks
):
    from tests.console.diagnosis.test_incidents import _report

    _endpoint(receiver.url())
    node = make_node(name="node-b", npus=2)
    dep = make_deployment("chat", model_path="/models/x", served_model_name="x")
    replica = make_replica(dep, node=node, index=0, state="failed")
    with django_capture_on_commit_callbacks(execute=True):
        incident = incidents.open_incident_for_replica(replica, _report(replica))
        incidents.resolve_incident(actor=_admin(), incident_id=incident.pk)
    _run_queued(sent)
    opened, resolved = (d.json for d in receiver.received)
    assert opened["event"] == "opened" and resolved["event"] == "resolved"
    assert opened["replica"] == {"id": replica.pk, "deployment": "chat", "index": 0}
    assert opened["node"] == "node-b" and opened["npu"] is None
    assert opened["subject"].startswith(f"[{incident.severity}] chat replica 0 on node-b: ")
    assert resolved["subject"].startswith("[resolved] chat replica 0 on node-b: ")
    assert opened["diagnosis"]["category"] == incident.category


# --- 4. folded repeats wait for the re-notify interval --------------------------------------
@pytest.mark.django_db
def test_folded_repeats_page_again_only_after_the_renotify_interval(
    receiver, no_env_webhook, sent, django_capture_on_commit_callbacks
):
    endpoint = _endpoint(receiver.url(), renotify_minutes=30)
    every = _endpoint(receiver.url("/every"), name="every-repeat", renotify_minutes=0)
    incident = _chip_incident()
    t0 = timezone.now()
    queued = sent
    with django_capture_on_commit_callbacks(execute=True):
        webhooks.dispatch(incident.pk, "opened", now=t0)
        for minutes in (5, 10, 29):
            _fold(incident, t0 + timedelta(minutes=minutes))
    to_main = [a for a in queued if a[2] == str(endpoint.pk)]
    assert [a[1] for a in to_main] == ["opened"]  # three repeats inside 30 min: nothing
    assert len([a for a in queued if a[2] == str(every.pk)]) == 4  # 0 = every repeat
    with django_capture_on_commit_callbacks(execute=True):
        _fold(incident, t0 + timedelta(minutes=31))
        _fold(incident, t0 + timedelta(minutes=32))  # inside the new interval again
    to_main = [a for a in queued if a[2] == str(endpoint.pk)]
    assert [(a[1], a[3]) for a in to_main] == [("opened", 0), ("folded", 4)]
    _run_queued(to_main)
    assert [d.json["counts"]["repeats"] for d in receiver.received] == [0, 4]
    notice = WebhookNotice.objects.get(incident=incident, endpoint_key=str(endpoint.pk))
    assert notice.sent_at == t0 + timedelta(minutes=31) and notice.count == 5


@pytest.mark.django_db
def test_an_endpoint_gets_only_incidents_at_or_above_its_minimum_severity(
    no_env_webhook, sent, django_capture_on_commit_callbacks
):
    crit_only = _endpoint("http://127.0.0.1:9/a", name="crit", min_severity="critical")
    everything = _endpoint("http://127.0.0.1:9/b", name="all", min_severity="info")
    _endpoint("http://127.0.0.1:9/c", name="off", enabled=False)
    warning = _chip_incident(severity="warning")
    with django_capture_on_commit_callbacks(execute=True):
        webhooks.dispatch(warning.pk, "opened")
    assert [a[2] for a in sent] == [str(everything.pk)]
    assert crit_only.pk  # exists, and was not sent a warning


# --- 5. endpoints: services, API, pages ------------------------------------------------------
@pytest.mark.django_db
def test_each_endpoint_signs_with_its_own_secret(no_env_webhook):
    with (
        Receiver(secret="secret-of-a-000000000") as a,
        Receiver(secret="secret-of-b-00000000") as b,
    ):
        ea = _endpoint(a.url(), name="a", secret="secret-of-a-000000000")
        eb = _endpoint(b.url(), name="b", secret="secret-of-b-00000000")
        incident = _chip_incident()
        webhooks.deliver(incident.pk, "opened", str(ea.pk))
        webhooks.deliver(incident.pk, "opened", str(eb.pk))
    assert a.received[0].verified and b.received[0].verified
    assert not verify(
        b.received[0].body,
        b.received[0].headers["x-npu-console-signature"],
        "secret-of-a-000000000",
        now=time.time(),
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "javascript:alert(1)",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/hook",
        "http://0.0.0.0:8080/hook",
        "http://metadata.google.internal/computeMetadata/v1/",
        "https:///no-host",
        "http://exa mple.com/",
    ],
)
def test_api_refuses_bad_urls_with_422_naming_url(admin_client_, url):
    response = admin_client_.post(
        "/api/v1/webhooks", {"name": "x", "url": url}, content_type="application/json"
    )
    assert response.status_code == 422, response.content
    assert response.json()["field"] == "url"
    assert not WebhookEndpoint.objects.exists()


def test_a_name_resolving_to_a_link_local_address_is_never_contacted(monkeypatch, db):
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda *a, **kw: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 0))],
    )
    tgt = webhooks.Target(key="1", name="sneaky", url="http://rebind.example/hook", secret="")
    with pytest.raises(webhooks.Refused):
        webhooks.post(tgt, b"{}")


@pytest.mark.django_db
def test_a_dns_answer_changing_after_the_check_does_not_move_the_delivery(monkeypatch):
    # DNS rebinding: the first answer passes the check, every later one names another
    # service (a second local server standing in for an internal one: a lookup made when
    # connecting would dial its port, which the answer carries)
    real = socket.getaddrinfo
    with Receiver() as checked, Receiver() as internal:
        lookups = []

        def rebinding(host, port, *args, **kwargs):
            if host != "hooks.rebind.example":
                return real(host, port, *args, **kwargs)
            lookups.append(host)
            answer = checked.port if len(lookups) == 1 else internal.port
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", answer))]

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        url = f"http://hooks.rebind.example:{checked.port}/hooks/{TOKEN}"
        tgt = webhooks.Target(key="1", name="rebound", url=url, secret="")
        assert webhooks.post(tgt, b"{}") == 200
    assert len(lookups) == 1
    assert len(checked.received) == 1 and internal.received == []
    assert checked.received[0].headers["host"] == f"hooks.rebind.example:{checked.port}"


@pytest.mark.django_db
def test_a_name_with_several_addresses_is_tried_on_each_it_was_checked_with(monkeypatch):
    # the first address refuses (nothing listens on 127.0.0.2), the second takes it
    real = socket.getaddrinfo

    def two(host, port, *args, **kwargs):
        if host != "hooks.two.example":
            return real(host, port, *args, **kwargs)
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", two)
    with Receiver() as receiver:
        url = f"http://hooks.two.example:{receiver.port}/hooks/{TOKEN}"
        tgt = webhooks.Target(key="1", name="two", url=url, secret="")
        assert webhooks.post(tgt, b"{}") == 200
    assert len(receiver.received) == 1


@pytest.mark.django_db
def test_api_create_list_patch_delete_masks_url_and_secret(
    admin_client_, viewer_client, no_env_webhook
):
    url = f"https://hooks.example.com/services/{TOKEN}"
    created = admin_client_.post(
        "/api/v1/webhooks",
        {"name": "slack", "url": url, "min_severity": "critical", "renotify_minutes": 10},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["url"] == "https://hooks.example.com/***" and body["secret"] == "***"
    assert len(body["secret_value"]) >= 32  # generated, shown this once
    stored = WebhookEndpoint.objects.get(name="slack")
    assert stored.url == url and stored.secret == body["secret_value"]

    listed = viewer_client.get("/api/v1/webhooks").json()
    assert [(e["name"], e["url"], e["secret"]) for e in listed] == [
        ("slack", "https://hooks.example.com/***", "***")
    ]
    assert TOKEN not in json.dumps(listed) and stored.secret not in json.dumps(listed)

    # a GET -> PATCH round trip with the shown values keeps the stored ones
    patched = admin_client_.patch(
        f"/api/v1/webhooks/{stored.pk}",
        {"url": listed[0]["url"], "secret": "***", "enabled": False},
        content_type="application/json",
    )
    assert patched.status_code == 200, patched.content
    stored.refresh_from_db()
    assert stored.url == url and stored.secret == body["secret_value"] and not stored.enabled
    bad = admin_client_.patch(
        f"/api/v1/webhooks/{stored.pk}",
        {"url": "http://169.254.169.254/"},
        content_type="application/json",
    )
    assert bad.status_code == 422 and bad.json()["field"] == "url"

    assert admin_client_.delete(f"/api/v1/webhooks/{stored.pk}").status_code == 204
    assert not WebhookEndpoint.objects.exists()

    audit = AuditEntry.objects.filter(action__startswith="webhook.")
    assert [e.action for e in audit.order_by("pk")] == [
        "webhook.create",
        "webhook.update",
        "webhook.delete",
    ]
    dumped = json.dumps([[e.before, e.after, e.message] for e in audit])
    assert TOKEN not in dumped and body["secret_value"] not in dumped


@pytest.mark.django_db
def test_only_admins_change_webhooks(operator_client, viewer_client, no_env_webhook):
    payload = {"name": "x", "url": "https://hooks.example.com/x"}
    for client in (operator_client, viewer_client):
        response = client.post("/api/v1/webhooks", payload, content_type="application/json")
        assert response.status_code == 403
    operator = make_user("otto-hooks", "operator")
    with pytest.raises(Forbidden):
        webhook_services.create_endpoint(actor=Actor(user=operator, name="otto-hooks"), **payload)
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
def test_api_send_test_answers_the_receivers_status(admin_client_, receiver, no_env_webhook):
    endpoint = _endpoint(receiver.url())
    receiver.answers = [202]
    response = admin_client_.post(f"/api/v1/webhooks/{endpoint.pk}/test")
    assert response.json() == {"ok": True, "status": 202, "error": ""}
    assert receiver.received[0].json["event"] == "test" and receiver.received[0].verified
    endpoint.refresh_from_db()
    assert endpoint.last_status == 202 and endpoint.last_event == "test"
    assert AuditEntry.objects.filter(action="webhook.test").exists()


@pytest.mark.django_db
def test_short_secret_is_refused(no_env_webhook):
    with pytest.raises(Invalid) as err:
        webhook_services.create_endpoint(
            actor=_admin(), name="x", url="https://hooks.example.com/x", secret="short"
        )
    assert err.value.field == "secret"


@pytest.mark.django_db
def test_env_endpoint_still_delivers_and_is_listed_read_only(
    receiver, monkeypatch, viewer_client, sent, django_capture_on_commit_callbacks
):
    monkeypatch.setenv("INCIDENT_WEBHOOK_URL", receiver.url())
    monkeypatch.setenv("INCIDENT_WEBHOOK_SECRET", SECRET)
    incident = _chip_incident()
    with django_capture_on_commit_callbacks(execute=True):
        webhooks.dispatch(incident.pk, "opened")
    assert sent == [[incident.pk, "opened", "env", 0]]
    _run_queued(sent)
    assert receiver.received[0].verified
    send_webhook.apply(args=[incident.pk, "resolved"])  # a task queued before endpoints existed
    assert receiver.received[1].json["event"] == "resolved"
    [listed] = viewer_client.get("/api/v1/webhooks").json()
    assert listed["read_only"] and listed["id"] is None
    assert listed["url"] == f"http://127.0.0.1:{receiver.port}/***"


@pytest.mark.django_db
def test_viewer_sees_the_masked_list_without_forms(viewer_client, no_env_webhook):
    _endpoint(f"https://hooks.example.com/{TOKEN}", name="slack")
    page = viewer_client.get("/incidents/webhooks/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "https://hooks.example.com/***" in html and TOKEN not in html and SECRET not in html
    assert "Send test" not in html and "Add webhook" not in html
    assert viewer_client.post("/incidents/webhooks/new", {"name": "x"}).status_code == 403


@pytest.mark.django_db
def test_admin_creates_edits_tests_disables_and_deletes_on_the_page(
    admin_client_, receiver, no_env_webhook
):
    response = admin_client_.post(
        "/incidents/webhooks/new",
        {
            "name": "oncall",
            "url": receiver.url(),
            "secret": SECRET,
            "min_severity": "critical",
            "renotify_minutes": "15",
            "enabled": "on",
        },
        follow=True,
    )
    assert SECRET in response.content.decode()  # shown once, right after creation
    assert SECRET not in admin_client_.get("/incidents/webhooks/").content.decode()
    endpoint = WebhookEndpoint.objects.get(name="oncall")
    assert endpoint.min_severity == "critical" and endpoint.renotify_minutes == 15

    row = admin_client_.post(f"/incidents/webhooks/{endpoint.pk}/test", HTTP_HX_REQUEST="true")
    html = row.content.decode()
    assert (
        html.lstrip().startswith("<tr")
        and 'receiver answered <span class="badge badge--ok">HTTP 200' in html
    )
    assert receiver.received[0].verified

    admin_client_.post(
        f"/incidents/webhooks/{endpoint.pk}/edit",
        {
            "name": "oncall",
            "url": "",
            "secret": "",
            "min_severity": "info",
            "renotify_minutes": "5",
        },
    )
    endpoint.refresh_from_db()
    assert endpoint.url == receiver.url() and endpoint.secret == SECRET  # kept
    assert endpoint.min_severity == "info" and not endpoint.enabled  # checkbox unticked
    bad = admin_client_.post(
        f"/incidents/webhooks/{endpoint.pk}/edit",
        {"name": "oncall", "url": "ftp://x/", "min_severity": "info", "renotify_minutes": "5"},
    )
    assert "only http:// and https://" in bad.content.decode()
    admin_client_.post(f"/incidents/webhooks/{endpoint.pk}/toggle")
    endpoint.refresh_from_db()
    assert endpoint.enabled
    admin_client_.post(f"/incidents/webhooks/{endpoint.pk}/delete")
    assert not WebhookEndpoint.objects.exists()
