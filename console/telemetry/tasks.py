"""Beat jobs of telemetry (queue `console`). Thin: the logic is in services and rollups.

All three are idempotent: flushing re-inserts nothing (unique samples), rollups are upserts,
purging deletes by age.
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone


@shared_task(name="telemetry.flush_samples", ignore_result=True)
def flush_samples() -> int:
    """Move buffered raw samples from Redis to the database (every 5 s)."""
    from console.telemetry.services import flush_samples as run

    return run()


@shared_task(name="telemetry.rollup", ignore_result=True)
def rollup() -> dict[str, int]:
    """Build 1-minute and 1-hour rollups of completed buckets (every 60 s)."""
    from console.telemetry.rollups import roll_up

    return roll_up(now=timezone.now())


@shared_task(name="telemetry.purge", ignore_result=True)
def purge() -> dict[str, int]:
    """Delete raw samples and rollups past their retention (hourly)."""
    from console.telemetry.rollups import purge_telemetry

    return purge_telemetry(now=timezone.now())
