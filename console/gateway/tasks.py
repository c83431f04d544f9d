"""Console-side gateway jobs (queue `console`)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="gateway.flush_usage", ignore_result=True)
def flush_usage() -> int:
    """Beat job: fold the usage counted in Redis into the database (safe to repeat)."""
    from console.gateway.usage import flush

    return flush()
