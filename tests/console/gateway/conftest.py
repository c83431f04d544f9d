"""Fixtures the gateway tests share."""

from __future__ import annotations

import asyncio
import gc

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from console.hot import get_redis


@pytest.fixture(autouse=True)
def redis_trusted_again():
    """A test that made Redis fail leaves the gateway's client skipping it for the breaker's
    DOWN_S: not into the next test."""
    from console.gateway.redisclient import breaker

    breaker.reset()
    yield
    breaker.reset()


@pytest.fixture(autouse=True)
def collector_unfrozen():
    """A test that ran the gateway's lifespan froze the test process's objects (gc.freeze):
    they are the collector's again after it."""
    yield
    gc.unfreeze()


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


@pytest.fixture
def gateway_db_thread(transactional_db):
    """The database for tests that run the gateway's ORM reads in this process: they run in
    asgiref's shared executor thread, whose connection would outlive the test (and keep
    PostgreSQL from dropping the test database at the end); closed after the test."""
    yield
    asyncio.run(sync_to_async(connections.close_all)())
