"""The broker from the settings (embedded Redis by default) carries a task to a real worker."""

from __future__ import annotations

import pytest

from console.celery import app

pytestmark = pytest.mark.worker


def test_task_round_trips_through_redis_to_a_real_worker(console_worker):
    result = app.send_task("console.ping", args=["hello"], queue="console").get(timeout=30)
    assert result["pong"] == "hello"
    assert (
        "received" in console_worker.output().lower()
        or "succeeded" in console_worker.output().lower()
    )


def test_embedded_redis_is_a_unix_socket_without_tcp(redis_url):
    import os

    if os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL set: running against an external Redis")
    import redis

    client = redis.Redis.from_url(redis_url)
    assert client.ping()
    assert client.config_get("port")["port"] == "0"
