"""Telemetry fixtures: a private Redis key prefix per test (builders are in builders.py)."""

from __future__ import annotations

import uuid

import pytest

from console.hot import get_redis
from console.telemetry import services


@pytest.fixture
def hot(redis_url, monkeypatch):
    """Redis with telemetry keys under a prefix of this test's own (`npc:t-<uuid>:`), deleted
    afterwards: safe on a Redis shared with other runs (no FLUSHALL, no foreign keys)."""
    prefix = f"npc:t-{uuid.uuid4().hex[:12]}:"
    monkeypatch.setattr(services, "KEY_PREFIX", prefix)
    r = get_redis()
    yield r
    keys = list(r.scan_iter(f"{prefix}*"))
    if keys:
        r.delete(*keys)
