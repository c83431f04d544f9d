"""Tasks the console sends to this host (queue host.<node>). Each is idempotent."""

from __future__ import annotations

import socket
import time

from celery import shared_task

from workers.contracts import AGENT_VERSION, Tasks


@shared_task(name=Tasks.HOST_PING)
def ping(value: str = "") -> dict:
    """Answer the console: proves the queue reaches this agent. No side effects."""
    return {
        "pong": value,
        "host": socket.gethostname(),
        "agent_version": AGENT_VERSION,
        "time": time.time(),
    }
