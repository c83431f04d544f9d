"""The gateway's way into the ORM.

The gateway is a Starlette app beside Django, so Django's request signals never fire for it
and nothing drops a connection that went stale (a PostgreSQL restart, an administrator's
terminate, CONN_MAX_AGE passed). Each read here does first what `request_started` does for
Django's views: `close_old_connections()`, which with CONN_HEALTH_CHECKS replaces a dead
connection instead of failing every request that follows on it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

log = logging.getLogger("console.gateway")

T = TypeVar("T")


def _fresh(fn: Callable[[], T]) -> T:
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
