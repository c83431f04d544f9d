"""Benchmark runs and webhook deliveries go to queue `console.jobs`, served by its own worker
(compose.yaml `jobs-worker`, `make run`'s jobs-worker): they never take a slot that heartbeats
and engine reports on queue `console` need."""

from __future__ import annotations

import pytest

from console.benchmarks import services as benchmark_services
from console.diagnosis import webhooks
from workers.contracts import CONSOLE_QUEUE, JOBS_QUEUE


@pytest.fixture
def sent(monkeypatch):
    from console.celery import app

    calls = []
    monkeypatch.setattr(app, "send_task", lambda name, **kw: calls.append((name, kw["queue"])))
    return calls


def test_jobs_queue_is_not_the_inbound_queue():
    assert JOBS_QUEUE == "console.jobs" and JOBS_QUEUE != CONSOLE_QUEUE


def test_benchmark_run_is_sent_to_the_jobs_queue(sent):
    benchmark_services._dispatch(41)
    assert sent == [("benchmarks.execute", JOBS_QUEUE)]


@pytest.mark.django_db
def test_webhook_delivery_is_sent_to_the_jobs_queue(
    sent, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setenv("INCIDENT_WEBHOOK_URL", "http://127.0.0.1:9/hook")
    with django_capture_on_commit_callbacks(execute=True):
        webhooks.dispatch(7, "opened")
    assert sent == [("diagnosis.send_webhook", JOBS_QUEUE)]
