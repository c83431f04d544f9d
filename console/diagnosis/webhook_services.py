"""Webhook endpoints: create, change, delete, send a test. Every write needs the admin role
and writes one audit entry in its transaction; the URL and the secret never go into it (the
audit log shows only the URL's scheme and host, and whether either changed).

URL rule (422 naming `url`): http or https, a host, at most 2000 characters, no whitespace;
never a link-local/unspecified/multicast literal address (169.254.169.254, the cloud metadata
service, fe80::…) nor a metadata host name. Loopback and private addresses are accepted:
receivers often live on the operators' own network. A name resolving to a refused address
is caught again at each delivery, which connects to the addresses checked
(webhooks.check_destination; no second lookup, so no DNS rebinding).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.diagnosis import webhooks
from console.diagnosis.models import Severity, WebhookEndpoint, WebhookNotice
from console.errors import Conflict, Invalid, NotFound
from workers.engine.argv import REDACTED

MAX_URL = 2000
MAX_RENOTIFY_MINUTES = 7 * 24 * 60
METADATA_HOSTS = {"metadata", "metadata.google.internal", "metadata.azure.com"}


def shown_url(url: str) -> str:
    """What anyone is shown of a URL: scheme and host (with port), the rest `***`."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return REDACTED
    if not parts.scheme or not host:
        return REDACTED
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}/{REDACTED}"


def check_url(url: str) -> str:
    """The URL, stripped, when acceptable (module docstring); else Invalid naming `url`."""
    url = (url or "").strip()
    if not url:
        raise Invalid("url: required", field="url")
    if len(url) > MAX_URL:
        raise Invalid(f"url: at most {MAX_URL} characters", field="url")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise Invalid("url: must not contain spaces or control characters", field="url")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise Invalid("url: not a valid URL", field="url") from None
    if parts.scheme not in {"http", "https"}:
        raise Invalid("url: only http:// and https:// URLs", field="url")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise Invalid("url: no host", field="url")
    if webhooks.refused_address(host) or host in METADATA_HOSTS:
        raise Invalid(
            "url: link-local and metadata addresses (e.g. 169.254.169.254) are refused",
            field="url",
        )
    return url


def _check_fields(*, name: str, min_severity: str, renotify_minutes: int) -> str:
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise Invalid("name: 1 to 100 characters", field="name")
    if min_severity not in Severity.values:
        raise Invalid(f"min_severity: one of {', '.join(Severity.values)}", field="min_severity")
    if not 0 <= int(renotify_minutes) <= MAX_RENOTIFY_MINUTES:
        raise Invalid(f"renotify_minutes: 0 to {MAX_RENOTIFY_MINUTES}", field="renotify_minutes")
    return name


def _check_secret(secret: str) -> str:
    secret = (secret or "").strip()
    if secret == REDACTED or (secret and not 16 <= len(secret) <= 200):
        raise Invalid("secret: 16 to 200 characters, or empty to generate one", field="secret")
    return secret or secrets.token_urlsafe(32)


def _audited(endpoint: WebhookEndpoint, **extra) -> dict:
    """What the audit log keeps of an endpoint: never the URL or the secret."""
    return {
        "name": endpoint.name,
        "url": shown_url(endpoint.url),
        "enabled": endpoint.enabled,
        "min_severity": endpoint.min_severity,
        "renotify_minutes": endpoint.renotify_minutes,
        **extra,
    }


def shown(endpoint: WebhookEndpoint) -> dict:
    """An endpoint as anyone is shown it (API, pages): URL scheme + host, secret `***`."""
    return {
        "id": endpoint.pk,
        "name": endpoint.name,
        "url": shown_url(endpoint.url),
        "secret": REDACTED,
        "enabled": endpoint.enabled,
        "min_severity": endpoint.min_severity,
        "renotify_minutes": endpoint.renotify_minutes,
        "read_only": False,
        "last_delivery_at": endpoint.last_delivery_at,
        "last_status": endpoint.last_status,
        "last_error": endpoint.last_error,
        "last_event": endpoint.last_event,
    }


def shown_endpoints() -> list[dict]:
    """Every endpoint, shown: the env one first (read-only, when set), then by name."""
    out = []
    env_tgt = webhooks.env_target()
    if env_tgt is not None:
        out.append(
            {
                "id": None,
                "name": env_tgt.name,
                "url": shown_url(env_tgt.url),
                "secret": REDACTED if env_tgt.secret else "",
                "enabled": True,
                "min_severity": env_tgt.min_severity,
                "renotify_minutes": env_tgt.renotify_minutes,
                "read_only": True,
                "last_delivery_at": None,
                "last_status": None,
                "last_error": "",
                "last_event": "",
            }
        )
    return out + [shown(e) for e in WebhookEndpoint.objects.all()]


def get_endpoint(endpoint_id: int) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"webhook {endpoint_id} not found", field="id")
    return endpoint


def create_endpoint(
    *,
    actor: Actor,
    name: str,
    url: str,
    secret: str = "",
    enabled: bool = True,
    min_severity: str = Severity.WARNING,
    renotify_minutes: int = webhooks.DEFAULT_RENOTIFY_MINUTES,
) -> WebhookEndpoint:
    """A new endpoint (admin). An empty secret is generated; the caller shows it once."""
    check_role(actor, Role.ADMIN)
    name = _check_fields(name=name, min_severity=min_severity, renotify_minutes=renotify_minutes)
    url, secret = check_url(url), _check_secret(secret)
    try:
        with transaction.atomic():
            endpoint = WebhookEndpoint.objects.create(
                name=name,
                url=url,
                secret=secret,
                enabled=enabled,
                min_severity=min_severity,
                renotify_minutes=renotify_minutes,
            )
            record(actor=actor, action="webhook.create", obj=endpoint, after=_audited(endpoint))
    except IntegrityError:
        raise Conflict(f"name: a webhook named {name!r} exists", field="name") from None
    return endpoint


def update_endpoint(*, actor: Actor, endpoint_id: int, **changes) -> WebhookEndpoint:
    """Change some of name, url, secret, enabled, min_severity, renotify_minutes (admin).
    A url or secret that is empty, or equal to what is shown of the stored one, keeps it."""
    check_role(actor, Role.ADMIN)
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().filter(pk=endpoint_id).first()
        if endpoint is None:
            raise NotFound(f"webhook {endpoint_id} not found", field="id")
        before = _audited(endpoint)
        url, secret = changes.pop("url", None), changes.pop("secret", None)
        url_changed = bool(url) and url != shown_url(endpoint.url) and url != endpoint.url
        secret_changed = bool(secret) and secret != REDACTED and secret != endpoint.secret
        for field in ("name", "enabled", "min_severity", "renotify_minutes"):
            if changes.get(field) is not None:
                setattr(endpoint, field, changes[field])
        endpoint.name = _check_fields(
            name=endpoint.name,
            min_severity=endpoint.min_severity,
            renotify_minutes=endpoint.renotify_minutes,
        )
        if url_changed:
            endpoint.url = check_url(url)
        if secret_changed:
            endpoint.secret = _check_secret(secret)
        try:
            with transaction.atomic():
                endpoint.save()
        except IntegrityError:
            raise Conflict(
                f"name: a webhook named {endpoint.name!r} exists", field="name"
            ) from None
        after = _audited(endpoint, url_changed=url_changed, secret_changed=secret_changed)
        record(actor=actor, action="webhook.update", obj=endpoint, before=before, after=after)
    return endpoint


def delete_endpoint(*, actor: Actor, endpoint_id: int) -> None:
    """Delete an endpoint and its notices (admin); queued deliveries to it then send nothing."""
    check_role(actor, Role.ADMIN)
    with transaction.atomic():
        endpoint = get_endpoint(endpoint_id)
        record(actor=actor, action="webhook.delete", obj=endpoint, before=_audited(endpoint))
        WebhookNotice.objects.filter(endpoint_key=str(endpoint.pk)).delete()
        endpoint.delete()


@dataclass(frozen=True)
class TestResult:
    ok: bool
    status: int | None
    error: str

    @property
    def words(self) -> str:
        if self.status is not None:
            return f"HTTP {self.status}"
        return self.error or "not sent"


def send_test(*, actor: Actor, endpoint_id: int) -> TestResult:
    """Deliver a test payload now, synchronously, within webhooks.TEST_TIMEOUT_S and without
    retries (admin; works on a disabled endpoint too). Records the result on the endpoint and
    one audit entry "webhook.test" with the status."""
    check_role(actor, Role.ADMIN)
    endpoint = get_endpoint(endpoint_id)
    tgt = webhooks.endpoint_target(endpoint)
    status, error = None, ""
    try:
        status = webhooks.send(
            tgt, webhooks.test_payload(endpoint.name), "test", timeout=webhooks.TEST_TIMEOUT_S
        )
    except webhooks.RetryableError as exc:
        status, error = exc.status, "" if exc.status else str(exc).partition(": ")[2]
    except webhooks.Refused as exc:
        error = f"refused: {exc}"
    result = TestResult(ok=status is not None and 200 <= status < 300, status=status, error=error)
    with transaction.atomic():
        record(
            actor=actor,
            action="webhook.test",
            obj=endpoint,
            after={"name": endpoint.name, "result": result.words},
        )
    return result
