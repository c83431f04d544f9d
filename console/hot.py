"""The hot store: one Redis client for short-lived, cheap-to-read data (latest telemetry,
last-seen times, write-coalescing buffers). Nothing here is the source of truth."""

from __future__ import annotations

import redis
from django.conf import settings

_client: redis.Redis | None = None
_client_url: str | None = None


def get_redis() -> redis.Redis:
    """A process-wide client for settings.REDIS_URL (re-created if the setting changes)."""
    global _client, _client_url
    if _client is None or _client_url != settings.REDIS_URL:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5, health_check_interval=30
        )
        _client_url = settings.REDIS_URL
    return _client
