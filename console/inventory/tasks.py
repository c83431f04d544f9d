"""Console-side tasks of the inventory (queue `console`). Thin: the logic is in services."""

from __future__ import annotations

import socket

from celery import shared_task

from workers.contracts import Tasks


@shared_task(name=Tasks.PING)
def ping(value: str = "") -> dict:
    """Round-trip check of broker and console worker. No side effects."""
    return {"pong": value, "worker": socket.gethostname()}


@shared_task(name=Tasks.HEARTBEAT, ignore_result=True)
def heartbeat(payload: object = None) -> None:
    """The old, unauthenticated path (agents before 0.2): refused, counted and logged."""
    from console.inventory.inbox import refuse_legacy

    refuse_legacy(Tasks.HEARTBEAT)


@shared_task(name="inventory.mark_offline", ignore_result=True)
def mark_offline() -> list[str]:
    """Beat job: mark silent nodes offline (idempotent)."""
    from console.inventory.checks import expire_check_runs
    from console.inventory.heartbeats import mark_offline as run

    expire_check_runs()
    return run()


@shared_task(name=Tasks.CHECK_RESULTS, ignore_result=True)
def check_results(payload: object = None) -> None:
    """The old, unauthenticated path (agents before 0.2): refused, counted and logged."""
    from console.inventory.inbox import refuse_legacy

    refuse_legacy(Tasks.CHECK_RESULTS)


@shared_task(name="inventory.measure_clock_skew", ignore_result=True)
def measure_clock_skew(run_id: int) -> None:
    """Finish a check run with the agent's clock offset, measured by pings (a few ms while
    the agent answers; at most 3 x 5 s when it does not). Idempotent: a finished run is
    left alone."""
    from console.inventory.checks import finish_clock_check

    finish_clock_check(run_id)
