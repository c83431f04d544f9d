"""Promise: a console worker has no Celery remote control. Anyone who reaches the broker can
publish `celery control` broadcasts; a console worker does not listen to them, so it cannot be
inspected (its configuration holds the database URL), reconfigured or shut down that way."""

from __future__ import annotations

import base64
import json
import os
import time

import pytest
from celery.utils.nodenames import host_format
from django.conf import settings

from console.hot import get_redis
from tests.helpers import wait_for

pytestmark = [pytest.mark.security, pytest.mark.worker]


def worker_name() -> str:
    return host_format(f"console-test-{os.getpid()}@%h")  # as tests/conftest.py names it


def pidbox_subscribers() -> int:
    """Subscribers of the `celery.pidbox` broadcast channel (kombu's Redis fanout)."""
    r = get_redis()
    channels = [c for c in r.pubsub_channels() if b"celery.pidbox" in c]
    return sum(n for _, n in r.pubsub_numsub(*channels)) if channels else 0


def test_setting_is_off():
    assert settings.CELERY_WORKER_ENABLE_REMOTE_CONTROL is False
    from console.celery import app

    assert app.conf.worker_enable_remote_control is False


def test_console_worker_ignores_inspect_and_shutdown_broadcasts(console_worker):
    from console.celery import app

    name = worker_name()
    assert pidbox_subscribers() == 0, "something listens to remote control broadcasts"
    replies = app.control.inspect(timeout=1).conf() or {}
    assert name not in replies
    assert app.control.ping(destination=[name], timeout=1) == []

    # The broadcast does reach Redis: a subscriber of the pidbox channel would get it.
    watcher = get_redis().pubsub()
    watcher.psubscribe("*celery.pidbox*")
    wait_for(lambda: watcher.get_message(timeout=0.2), 5, message="the psubscribe answer")
    app.control.broadcast("shutdown", destination=[name])
    sent = wait_for(lambda: watcher.get_message(timeout=0.2), 5, message="the broadcast")
    watcher.close()
    command = json.loads(base64.b64decode(json.loads(sent["data"])["body"]))
    assert command["method"] == "shutdown" and command["destination"] == [name]

    time.sleep(2)  # a worker that obeyed would be exiting by now
    assert console_worker.popen.poll() is None, console_worker.output()
    pong = app.send_task("console.ping", args=["still here"], queue="console").get(timeout=10)
    assert pong
    assert "Warm shutdown" not in console_worker.output()
