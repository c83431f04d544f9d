"""Console-side tasks of deployments (queue `console`)."""

from __future__ import annotations

from celery import shared_task

from workers.contracts import Tasks


@shared_task(name="deployments.reconcile", ignore_result=True)
def reconcile() -> dict:
    """Beat job and kick after changes; idempotent."""
    from console.deployments.reconcile import reconcile as run

    return run()


@shared_task(name="deployments.autoscale", ignore_result=True)
def autoscale() -> dict:
    """Beat job: one autoscaling pass (console/deployments/autoscale.py)."""
    from console.deployments.autoscale import run

    return run()


@shared_task(name=Tasks.ENGINE_REPORT, ignore_result=True)
def engine_report(payload: object = None) -> None:
    """The old, unauthenticated path (agents before 0.2): refused, counted and logged."""
    from console.inventory.inbox import refuse_legacy

    refuse_legacy(Tasks.ENGINE_REPORT)
