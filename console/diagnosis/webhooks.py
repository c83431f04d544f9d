"""Incident webhooks: a signed JSON POST per endpoint on open, folded repeat and resolve.

Endpoints are WebhookEndpoint rows (managed on /incidents/webhooks/ and /api/v1/webhooks, each
with its own secret, minimum severity and re-notify interval), plus the legacy
INCIDENT_WEBHOOK_URL / INCIDENT_WEBHOOK_SECRET (env or `*_FILE`), kept as one read-only
endpoint keyed "env" (every severity, INCIDENT_WEBHOOK_RENOTIFY_MINUTES).

Guarantees:
- `dispatch` runs inside the transaction that opened/folded/resolved the incident and queues
  one Celery task per endpoint after it commits ("diagnosis.send_webhook", queue
  `console.jobs`, retried there on connection errors and 5xx).
- A folded repeat pages an endpoint again only once its re-notify interval has passed since
  that endpoint was last told about the incident; that one notification says how many repeats
  it stands for (WebhookNotice keeps the last notice per incident and endpoint).
- Signatures carry a timestamp (webhook_signing: `t=…,v1=HMAC(secret, "t.body")`).
- An endpoint's URL and secret are never logged, raised or stored in an error text: failures
  name the endpoint and the HTTP status or the kind of network error only.
- Redirects are not followed, and a host that resolves to a link-local address (cloud metadata,
  169.254.169.254) is never contacted: the name is resolved once per delivery and the
  connection goes to the addresses checked (no second lookup, no proxy), so a DNS answer that
  changes in between (rebinding) cannot move it.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import logging
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from console import env
from console.diagnosis.webhook_signing import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signature_header,
)
from workers.contracts import JOBS_QUEUE

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "deliver", "dispatch", "payload"]

log = logging.getLogger(__name__)

TIMEOUT_S = 10
TEST_TIMEOUT_S = 5
EVENTS = {"opened", "folded", "resolved"}
ENV_KEY = "env"
DEFAULT_RENOTIFY_MINUTES = 30


class RetryableError(Exception):
    """A connection error or a 5xx answer: worth trying again later. The message names the
    endpoint and the status or error kind, never its URL."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Refused(Exception):
    """The destination is one the console never contacts (link-local, metadata)."""


@dataclass(frozen=True)
class Target:
    """One endpoint as delivery sees it: a WebhookEndpoint row or the env endpoint."""

    key: str  # str(pk), or "env"
    name: str
    url: str
    secret: str
    min_severity: str = "info"
    renotify_minutes: int = DEFAULT_RENOTIFY_MINUTES

    def wants(self, severity: str) -> bool:
        from console.diagnosis.models import SEVERITY_RANK

        return SEVERITY_RANK.get(severity, 3) <= SEVERITY_RANK.get(self.min_severity, 2)


def env_target() -> Target | None:
    url = env.get_str("INCIDENT_WEBHOOK_URL") or ""
    if not url:
        return None
    return Target(
        key=ENV_KEY,
        name="INCIDENT_WEBHOOK_URL",
        url=url,
        secret=env.get_str("INCIDENT_WEBHOOK_SECRET") or "",
        renotify_minutes=env.get_int(
            "INCIDENT_WEBHOOK_RENOTIFY_MINUTES", DEFAULT_RENOTIFY_MINUTES, minimum=0
        ),
    )


def endpoint_target(row) -> Target:
    return Target(
        key=str(row.pk),
        name=row.name,
        url=row.url,
        secret=row.secret,
        min_severity=row.min_severity,
        renotify_minutes=row.renotify_minutes,
    )


def targets() -> list[Target]:
    """The env endpoint (when set) and every enabled WebhookEndpoint."""
    from console.diagnosis.models import WebhookEndpoint

    found = [t for t in [env_target()] if t is not None]
    return found + [endpoint_target(r) for r in WebhookEndpoint.objects.filter(enabled=True)]


def target(key: str) -> Target | None:
    """The endpoint `key` names, None when it is gone or disabled."""
    from console.diagnosis.models import WebhookEndpoint

    if key == ENV_KEY:
        return env_target()
    row = (
        WebhookEndpoint.objects.filter(pk=int(key), enabled=True).first() if key.isdigit() else None
    )
    return endpoint_target(row) if row else None


# --- the payload ----------------------------------------------------------------------------
def public_url(path: str) -> str:
    """`path` made absolute with settings.PUBLIC_URL (the console's address as people reach it)."""
    return settings.PUBLIC_URL.rstrip("/") + path


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _where(incident) -> str:
    """What failed, in words: "npu-3 on node-a", "chat replica 0 on node-a"."""
    node = incident.node.name if incident.node_id and incident.node else ""
    acc = incident.accelerator if incident.accelerator_id else None
    if acc is not None:
        chip = f".{acc.chip_id}" if acc.chip_id else ""
        return f"npu-{acc.npu_id}{chip}" + (f" on {node}" if node else "")
    return incident.subject or node or incident.category


def subject(incident, event: str) -> str:
    """One line: "[critical] npu-3 on node-a: HBM ECC errors" ("[resolved] …" once resolved)."""
    top = incident.diagnoses[0] if incident.diagnoses else None
    what = (top or {}).get("title") or incident.title
    tag = "resolved" if event == "resolved" else incident.severity
    return _one_line(f"[{tag}] {_where(incident)}: {what}")


def _diagnosis(incident) -> dict | None:
    if not incident.diagnoses:
        return None
    top = incident.diagnoses[0]
    return {
        "rule": top.get("rule", ""),
        "category": top.get("category", ""),
        "title": top.get("title", ""),
        "confidence": top.get("confidence", ""),
        "remedy": [str(step)[:500] for step in (top.get("remediation") or [])[:5]],
    }


def payload(incident, event: str, *, repeats: int = 0, now: datetime | None = None) -> bytes:
    """The JSON body: event, one-line subject, absolute URL, where (node, replica, NPU), the
    top diagnosis with its remedy and the counts. `repeats`: folded repeats since this
    endpoint's previous notice about the incident."""
    path = reverse("incident-detail", args=[incident.pk])
    replica = incident.replica if incident.replica_id else None
    acc = incident.accelerator if incident.accelerator_id else None
    line = subject(incident, event)
    data = {
        "event": event,
        "subject": line,
        "text": f"{line}\n{public_url(path)}",  # what chat hooks (Slack-style) display
        "url": public_url(path),
        "sent_at": (now or timezone.now()).isoformat(),
        "incident": {
            "id": incident.pk,
            "category": incident.category,
            "severity": incident.severity,
            "title": incident.title,
            "status": incident.status,
            "count": incident.count,
            "first_seen": incident.first_seen.isoformat(),
            "last_seen": incident.last_seen.isoformat(),
            "url": public_url(path),
            "path": path,
        },
        "node": incident.node.name if incident.node_id and incident.node else None,
        "replica": (
            {"id": replica.pk, "deployment": replica.deployment.name, "index": replica.index}
            if replica
            else None
        ),
        "npu": {"npu_id": acc.npu_id, "chip_id": acc.chip_id} if acc else None,
        "diagnosis": _diagnosis(incident),
        "counts": {"occurrences": incident.count, "repeats": repeats},
    }
    return json.dumps(data, separators=(",", ":")).encode()


def test_payload(endpoint_name: str, *, now: datetime | None = None) -> bytes:
    """The body "Send test" delivers: event "test", shaped like an incident's."""
    line = f"[info] test from NPU Console to webhook {endpoint_name}"
    data = {
        "event": "test",
        "subject": _one_line(line),
        "text": f"{line}\n{public_url(reverse('webhook-list'))}",
        "url": public_url(reverse("webhook-list")),
        "sent_at": (now or timezone.now()).isoformat(),
        "incident": None,
        "node": None,
        "replica": None,
        "npu": None,
        "diagnosis": None,
        "counts": {"occurrences": 0, "repeats": 0},
    }
    return json.dumps(data, separators=(",", ":")).encode()


# --- sending --------------------------------------------------------------------------------
def refused_address(address: str) -> bool:
    """Link-local (169.254.0.0/16 — cloud metadata — and fe80::/10), unspecified, multicast."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if getattr(ip, "ipv4_mapped", None):
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip.is_unspecified or ip.is_multicast


def check_destination(url: str) -> list[str]:
    """The addresses the URL's host resolves to, once: the POST connects to these and looks
    the name up no more (a DNS answer changing between the check and the connection — DNS
    rebinding — cannot move it). Raises Refused when the host is, or resolves to, a refused
    address. Loopback and private networks are allowed (receivers on the operators' own
    network). An empty list: the name did not resolve (the POST fails, retryable)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if refused_address(host):
        raise Refused("link-local or unspecified address")
    try:  # a bad port (ValueError), a name IDNA refuses (UnicodeError): not resolved
        infos = socket.getaddrinfo(host, parts.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        return []
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if any(refused_address(address) for address in addresses):
        raise Refused("resolves to a link-local address")
    return addresses


def _connect_to(addresses: list[str]):
    """socket.create_connection for http.client, to the checked addresses in turn (the
    host name stays the connection's: Host header, TLS server name and certificate check)."""

    def create_connection(address, timeout, source_address=None):
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "name not resolved")
        error: OSError | None = None
        for ip in addresses:
            try:
                return socket.create_connection((ip, address[1]), timeout, source_address)
            except OSError as exc:
                error = exc
        raise error

    return create_connection


def _pinned(connection_class, addresses: list[str]):
    def factory(host, **kwargs):
        connection = connection_class(host, **kwargs)
        connection._create_connection = _connect_to(addresses)
        return connection

    return factory


class _PinnedHTTP(urllib.request.HTTPHandler):
    def __init__(self, addresses: list[str]) -> None:
        super().__init__()
        self.addresses = addresses

    def http_open(self, req):
        return self.do_open(_pinned(http.client.HTTPConnection, self.addresses), req)


class _PinnedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, addresses: list[str]) -> None:
        super().__init__()
        self.addresses = addresses

    def https_open(self, req):
        return self.do_open(
            _pinned(http.client.HTTPSConnection, self.addresses), req, context=self._context
        )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the receiver's answer (a 3xx status), never followed: it could point the
    signed body at another host, or at the metadata address."""

    def redirect_request(self, *args, **kwargs):
        return None


def _reason(exc: BaseException) -> str:
    """The kind of network error in a few words; never the URL or anything from it."""
    inner = getattr(exc, "reason", exc)
    if isinstance(inner, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(inner, ConnectionRefusedError):
        return "connection refused"
    if isinstance(inner, ConnectionResetError):
        return "connection reset"
    if isinstance(inner, socket.gaierror):
        return "name not resolved"
    if isinstance(inner, ssl.SSLError):
        return "TLS error"
    if isinstance(inner, http.client.HTTPException):
        return "bad HTTP answer"
    return type(inner).__name__


def post(tgt: Target, body: bytes, *, timeout: float | None = None) -> int:
    """POST `body` signed with the endpoint's secret. Returns the HTTP status of a 2xx, 3xx or
    4xx answer; raises RetryableError on 5xx and network errors, Refused on a refused host."""
    if urlsplit(tgt.url).scheme not in {"http", "https"}:
        raise Refused("not an http(s) URL")
    addresses = check_destination(tgt.url)
    stamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "npu-console",
        TIMESTAMP_HEADER: str(stamp),
    }
    if tgt.secret:
        headers[SIGNATURE_HEADER] = signature_header(body, tgt.secret, stamp)
    request = urllib.request.Request(tgt.url, data=body, headers=headers, method="POST")  # noqa: S310 - scheme checked above
    # no proxy: a proxy would resolve the name again, out of our sight
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        _PinnedHTTP(addresses),
        _PinnedHTTPS(addresses),
        _NoRedirect,
    )
    try:
        with opener.open(request, timeout=timeout or TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise RetryableError(f"webhook {tgt.name}: HTTP {exc.code}", exc.code) from None
        return exc.code  # 3xx/4xx: the receiver refuses it; trying again will not help
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        raise RetryableError(f"webhook {tgt.name}: {_reason(exc)}") from None


def record_delivery(key: str, event: str, *, status: int | None, error: str = "") -> None:
    """Remember an endpoint's last delivery (status or error kind) for the webhooks page."""
    from console.diagnosis.models import WebhookEndpoint

    if not key.isdigit():
        return
    WebhookEndpoint.objects.filter(pk=int(key)).update(
        last_delivery_at=timezone.now(),
        last_status=status,
        last_error=error[:200],
        last_event=event,
    )


def send(tgt: Target, body: bytes, event: str, *, timeout: float | None = None) -> int:
    """post() plus the record and the log line: endpoint name and status, never the URL."""
    try:
        status = post(tgt, body, timeout=timeout)
    except RetryableError as exc:
        error = "" if exc.status else str(exc).partition(": ")[2]
        record_delivery(tgt.key, event, status=exc.status, error=error)
        log.warning("%s (%s)", exc, event)
        raise
    except Refused as exc:
        record_delivery(tgt.key, event, status=None, error=f"refused: {exc}")
        log.warning("webhook %s: not delivered, %s (%s)", tgt.name, exc, event)
        raise
    record_delivery(tgt.key, event, status=status)
    if not 200 <= status < 300:
        log.warning("webhook %s: HTTP %s (%s)", tgt.name, status, event)
    return status


def deliver(incident_id: int, event: str, key: str = ENV_KEY, repeats: int = 0) -> int | None:
    """POST the incident's current state to endpoint `key`. Returns the HTTP status; None when
    the endpoint or the incident is gone, or the host is refused. Raises RetryableError on
    connection errors and 5xx."""
    from console.diagnosis.models import Incident

    if event not in EVENTS:  # the broker is not trusted to choose what a signed hook says
        raise ValueError(f"unknown webhook event {event!r}")
    tgt = target(str(key))
    incident = (
        Incident.objects.select_related("node", "replica__deployment", "accelerator")
        .filter(pk=incident_id)
        .first()
    )
    if tgt is None or incident is None:
        return None
    try:
        return send(tgt, payload(incident, event, repeats=max(0, int(repeats))), event)
    except Refused:
        return None


# --- deciding who is told -------------------------------------------------------------------
def _notice(incident, tgt: Target, event: str, now: datetime) -> int | None:
    """Whether `tgt` is told about this event now: None = not now, else the number of folded
    repeats the notification stands for. Updates WebhookNotice (conditional UPDATEs: two
    concurrent folds past the interval page once)."""
    from console.diagnosis.models import WebhookNotice

    notices = WebhookNotice.objects.filter(incident_id=incident.pk, endpoint_key=tgt.key)
    last = notices.first()
    if event == "folded" and last is not None:
        due = last.sent_at + timedelta(minutes=tgt.renotify_minutes)
        if now < due:
            return None
        if not notices.filter(sent_at=last.sent_at).update(sent_at=now, count=incident.count):
            return None  # another fold sent it meanwhile
        return max(0, incident.count - last.count)
    repeats = max(0, incident.count - (last.count if last else 1))
    if last is not None:
        notices.update(sent_at=now, count=incident.count)
        return repeats
    try:
        with transaction.atomic():
            WebhookNotice.objects.create(
                incident_id=incident.pk, endpoint_key=tgt.key, sent_at=now, count=incident.count
            )
    except IntegrityError:
        return None if event == "folded" else repeats  # a concurrent fold told it already
    return repeats


def dispatch(incident_id: int, event: str, *, now: datetime | None = None) -> None:
    """Queue one delivery per endpoint that wants this event, after the surrounding transaction
    commits; nothing when no endpoint is set. Call it inside that transaction."""
    from console.diagnosis.models import Incident

    found = targets()
    if not found:
        return
    now = now or timezone.now()
    incident = Incident.objects.filter(pk=incident_id).first()
    for tgt in found:
        if incident is None:  # delivery finds it gone and sends nothing
            repeats = 0
        elif not tgt.wants(incident.severity):
            continue
        else:
            repeats = _notice(incident, tgt, event, now)
            if repeats is None:
                continue
        _queue(incident_id, event, tgt.key, repeats)


def _queue(incident_id: int, event: str, key: str, repeats: int) -> None:
    from console.celery import app  # the console's app, not whichever is "current"

    transaction.on_commit(
        lambda: app.send_task(
            "diagnosis.send_webhook",
            args=[incident_id, event, key, repeats],
            queue=JOBS_QUEUE,
            ignore_result=True,
        )
    )
