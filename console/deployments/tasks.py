"""Console-side tasks of deployments (queue `console`)."""

from __future__ import annotations

from celery import shared_task

from workers.contracts import Tasks


@shared_task(name="deployments.reconcile", ignore_result=True)
def reconcile() -> dict:
    """Beat job and kick after changes; idempotent."""
    from console.deployments.reconcile import reconcile as run

    return run()


@shared_task(name=Tasks.ENGINE_REPORT, ignore_result=True)
def engine_report(payload: dict) -> None:
    """Apply an agent's engine report (idempotent; stale generations ignored)."""
    from console.deployments.engines import apply_report

    apply_report(payload)
