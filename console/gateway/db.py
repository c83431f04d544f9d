"""The gateway's way into the ORM.

The gateway is a Starlette app beside Django, so Django's request signals never fire for it
and nothing drops a connection that went stale (a PostgreSQL restart, an administrator's
terminate, CONN_MAX_AGE passed). Each read here does first what `request_started` does for
Django's views: `close_old_connections()`, which with CONN_HEALTH_CHECKS replaces a dead
connection instead of failing every request that follows on it.

On SQLite (the embedded default) Django keeps no connection between requests (CONN_MAX_AGE 0,
settings.py), and the routing table is read every second: opening a connection each time
(its PRAGMAs, Django's SQL functions registered again) was 2-4 ms of a 4.5-6.5 ms read, time
the event loop waits on the GIL. The gateway's reads keep theirs for KEEP_S while it answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connection

log = logging.getLogger("console.gateway")

T = TypeVar("T")
KEEP_S = 60.0  # as long as settings.py keeps a PostgreSQL connection


def _kept() -> bool:
    """This thread's SQLite connection was opened less than KEEP_S ago and still answers."""
    if (
        connection.vendor != "sqlite"
        or connection.connection is None
        or connection.errors_occurred
        or connection.in_atomic_block
        or connection.close_at is None  # CONN_MAX_AGE 0: opened at close_at
        or time.monotonic() - connection.close_at >= KEEP_S
    ):
        return False
    try:
        connection.connection.execute("SELECT 1")
    except Exception:  # closed underneath: replaced below
        return False
    return True


def _fresh(fn: Callable[[], T]) -> T:
    if not _kept():
        close_old_connections()
    return fn()


async def read(fn: Callable[[], T]) -> T:
    """Run `fn` (ORM reads) in Django's thread with a connection known to be alive."""
    return await sync_to_async(_fresh)(fn)


class Background:
    """At most one background task at a time on the running loop (a table read again off the
    request path: routing.Router, limits.Limiter). `start` does nothing while one runs."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._task: asyncio.Task | None = None

    def start(self, fn: Callable[[], Awaitable[None]]) -> None:
        task, loop = self._task, asyncio.get_running_loop()
        if task is None or task.done() or task.get_loop() is not loop:
            self._task = loop.create_task(self._run(fn))

    async def _run(self, fn: Callable[[], Awaitable[None]]) -> None:
        try:
            await fn()
        except Exception:  # the next request tries again; a stale table is waited for
            log.exception("%s failed", self.what)
