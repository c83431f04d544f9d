"""Console-side tasks of the inventory (queue `console`)."""

from __future__ import annotations

import socket

from celery import shared_task

from workers.contracts import Tasks


@shared_task(name=Tasks.PING)
def ping(value: str = "") -> dict:
    """Round-trip check of broker and console worker. No side effects."""
    return {"pong": value, "worker": socket.gethostname()}
