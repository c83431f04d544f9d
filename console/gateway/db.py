"""The gateway's way into the ORM.

The gateway is a Starlette app beside Django, so Django's request signals never fire for it
and nothing drops a connection that went stale (a PostgreSQL restart, an administrator's
terminate, CONN_MAX_AGE passed). Each read here does first what `request_started` does for
Django's views: `close_old_connections()`, which with CONN_HEALTH_CHECKS replaces a dead
connection instead of failing every request that follows on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections

T = TypeVar("T")


def _fresh(fn: Callable[[], T]) -> T:
    close_old_connections()
    return fn()


async def read(fn: Callable[[], T]) -> T:
    """Run `fn` (ORM reads) in Django's thread with a connection known to be alive."""
    return await sync_to_async(_fresh)(fn)
