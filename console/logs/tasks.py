"""Console-side tasks of engine logs (queue `console`). Thin: the logic is in services."""

from __future__ import annotations

from celery import shared_task

from workers.contracts import Tasks


@shared_task(name=Tasks.LOG_LINES, ignore_result=True)
def log_lines(payload: object = None) -> None:
    """The old, unauthenticated path (agents before 0.2): refused, counted and logged."""
    from console.inventory.inbox import refuse_legacy

    refuse_legacy(Tasks.LOG_LINES)


@shared_task(name="logs.purge", ignore_result=True)
def purge() -> int:
    """Beat job: delete lines past retention (idempotent)."""
    from console.logs.services import purge_logs

    return purge_logs()
