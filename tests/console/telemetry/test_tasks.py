"""The beat jobs exist under the scheduled names and run the services (called as plain functions)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from console.celery import app
from console.telemetry import services, tasks
from console.telemetry.models import ChipRollup, ChipSample
from tests.console.telemetry.builders import chip, heartbeat, sample
from tests.factories import make_node


def test_every_scheduled_telemetry_job_is_a_registered_task():
    scheduled = {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}
    names = {"telemetry.flush_samples", "telemetry.rollup", "telemetry.purge"}
    assert names <= scheduled
    assert names <= set(app.tasks)


def test_jobs_flush_roll_up_and_purge(hot, db):
    node = make_node("kp-01")
    now = timezone.now()
    hb = heartbeat("kp-01", [chip(0)], sent_at=now)
    services.record_heartbeat(node_id=node.pk, node_name="kp-01", received_at=now, hb=hb)
    assert tasks.flush_samples() == 1
    assert ChipSample.objects.count() == 1
    sample(node, now - timedelta(minutes=5))
    assert tasks.rollup()["1m"] == 1
    assert ChipRollup.objects.filter(resolution=60).count() == 1
    sample(node, now - timedelta(days=3))
    assert tasks.purge() == {"raw": 1, "1m": 0, "1h": 0}
