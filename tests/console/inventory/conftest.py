"""Fixtures of the inventory tests."""

from __future__ import annotations

import pytest

from console.hot import get_redis


@pytest.fixture
def hot(redis_url):
    """The hot store without the console's keys, before and after the test."""
    r = get_redis()

    def clean():
        keys = list(r.scan_iter("npc:*"))
        if keys:
            r.delete(*keys)

    clean()
    yield r
    clean()
