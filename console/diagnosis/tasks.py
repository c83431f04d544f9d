"""Celery tasks of the diagnosis app."""

from __future__ import annotations

from celery import shared_task

from console.diagnosis import webhooks


@shared_task(
    name="diagnosis.send_webhook",
    ignore_result=True,
    autoretry_for=(webhooks.RetryableError,),
    retry_backoff=2,
    retry_backoff_max=300,
    retry_jitter=False,
    max_retries=5,
)
def send_webhook(
    incident_id: int, event: str, endpoint: str = webhooks.ENV_KEY, repeats: int = 0
) -> int | None:
    """Deliver one incident event to one endpoint (a WebhookEndpoint pk, or "env" — the default,
    for tasks queued before endpoints existed); retried with exponential backoff (2, 4, 8… s,
    at most 5 times) on connection errors and 5xx. Sends the incident's state at delivery
    time; an endpoint deleted or disabled meanwhile gets nothing. The retry's log line names
    the endpoint and the status, never its URL (webhooks.RetryableError)."""
    return webhooks.deliver(incident_id, event, str(endpoint), repeats)
