"""Incident webhooks: a signed JSON POST on open, fold and resolve.

Settings are read at call time from INCIDENT_WEBHOOK_URL and INCIDENT_WEBHOOK_SECRET (env or
`*_FILE`). The body is signed with HMAC-SHA256 and sent as
`X-NPU-Console-Signature: sha256=<hex>`. Delivery runs in the Celery task
"diagnosis.send_webhook" on queue `console.jobs` (retries stay there), dispatched after the
transaction commits.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request

from django.db import transaction
from django.urls import reverse

from console import env
from workers.contracts import JOBS_QUEUE

SIGNATURE_HEADER = "X-NPU-Console-Signature"
TIMEOUT_S = 10
EVENTS = {"opened", "folded", "resolved"}


class RetryableError(Exception):
    """A connection error or a 5xx answer: worth trying again later."""


def webhook_url() -> str:
    return env.get_str("INCIDENT_WEBHOOK_URL") or ""


def sign(body: bytes, secret: str) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def payload(incident, event: str) -> bytes:
    data = {
        "event": event,
        "incident": {
            "id": incident.pk,
            "category": incident.category,
            "severity": incident.severity,
            "title": incident.title,
            "status": incident.status,
            "count": incident.count,
            "last_seen": incident.last_seen.isoformat(),
            "url": reverse("incident-detail", args=[incident.pk]),
        },
    }
    return json.dumps(data, separators=(",", ":")).encode()


def deliver(incident_id: int, event: str) -> int | None:
    """POST the incident's current state. Returns the HTTP status, None when no URL is set or
    the incident is gone. Raises RetryableError on connection errors and 5xx."""
    from console.diagnosis.models import Incident

    if event not in EVENTS:  # the broker is not trusted to choose what a signed hook says
        raise ValueError(f"unknown webhook event {event!r}")
    url = webhook_url()
    incident = Incident.objects.filter(pk=incident_id).first()
    if not url or incident is None:
        return None
    if not url.startswith(("http://", "https://")):
        raise ValueError("INCIDENT_WEBHOOK_URL: expected an http:// or https:// URL")
    body = payload(incident, event)
    headers = {"Content-Type": "application/json", "User-Agent": "npu-console"}
    secret = env.get_str("INCIDENT_WEBHOOK_SECRET") or ""
    if secret:
        headers[SIGNATURE_HEADER] = sign(body, secret)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 - scheme checked above
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            return response.status
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise RetryableError(f"{url}: HTTP {exc.code}") from None
        return exc.code  # 4xx: the receiver refuses it; trying again will not help
    except (urllib.error.URLError, OSError) as exc:
        raise RetryableError(f"{url}: {exc}") from None


def dispatch(incident_id: int, event: str) -> None:
    """Queue delivery after the surrounding transaction commits; nothing when no URL is set."""
    if not webhook_url():
        return
    from console.celery import app  # the console's app, not whichever is "current"

    transaction.on_commit(
        lambda: app.send_task(
            "diagnosis.send_webhook",
            args=[incident_id, event],
            queue=JOBS_QUEUE,
            ignore_result=True,
        )
    )
