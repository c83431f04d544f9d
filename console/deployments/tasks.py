"""Console-side tasks of deployments (queue `console`)."""

from __future__ import annotations

from celery import shared_task

from workers.contracts import Tasks


@shared_task(name="deployments.reconcile", ignore_result=True)
def reconcile() -> dict:
    """Beat job and kick after changes; idempotent."""
    from console.deployments.reconcile import reconcile as run

    return run()


@shared_task(name=Tasks.ENGINE_REPORT, ignore_result=True, acks_late=True)
def engine_report(payload: dict) -> None:
    """Apply an agent's engine report. Idempotent (a transition applied twice is one event;
    stale generations and older reports are ignored), so acks_late: a worker killed mid-task
    leaves the report to be delivered again, never lost."""
    from console.deployments.engines import apply_report

    apply_report(payload)
