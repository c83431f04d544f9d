"""Fixtures the gateway tests share."""

from __future__ import annotations

import pytest

from console.hot import get_redis


@pytest.fixture
def clean_redis(redis_url):
    """The test Redis without the gateway's keys (limits, in-flight counts, usage), before
    and after: counters left by one test never bind the next."""
    r = get_redis()
    for key in r.scan_iter("npc:gw:*"):
        r.delete(key)
    yield r
    for key in r.scan_iter("npc:gw:*"):
        r.delete(key)
