"""Console-side tasks of engine logs (queue `console`). Thin: the logic is in services."""

from __future__ import annotations

from celery import shared_task

from workers.contracts import Tasks


@shared_task(name=Tasks.LOG_LINES, ignore_result=True, acks_late=True)
def log_lines(payload: dict) -> int:
    """Store a shipped batch of lines. Idempotent (unique line numbers): acks_late is safe."""
    from console.logs.services import ingest_batch

    return ingest_batch(payload=payload)


@shared_task(name="logs.purge", ignore_result=True)
def purge() -> int:
    """Beat job: delete lines past retention (idempotent)."""
    from console.logs.services import purge_logs

    return purge_logs()
