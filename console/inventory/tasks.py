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
def heartbeat(payload: dict) -> None:
    """Apply an agent's heartbeat. Safe to repeat: it only records the latest facts."""
    from console.inventory.heartbeats import ingest_heartbeat

    ingest_heartbeat(payload)


@shared_task(name="inventory.mark_offline", ignore_result=True)
def mark_offline() -> list[str]:
    """Beat job: mark silent nodes offline (idempotent)."""
    from console.inventory.checks import expire_check_runs
    from console.inventory.heartbeats import mark_offline as run

    expire_check_runs()
    return run()


@shared_task(name=Tasks.CHECK_RESULTS, ignore_result=True, bind=True, max_retries=10)
def check_results(self, payload: dict) -> None:
    """Store an agent's node-check results (idempotent per run id). A report that overtakes
    the node's first heartbeat is retried until the node is registered."""
    from console.inventory.checks import NodeNotRegistered, store_results

    try:
        store_results(payload)
    except NodeNotRegistered as exc:
        raise self.retry(countdown=2) from exc
