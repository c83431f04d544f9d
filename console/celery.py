"""The console's Celery app: consumes queue `console` (heartbeats, reconcile, beat jobs).

Run with `celery -A console worker -Q console` and `celery -A console beat`.
"""

from __future__ import annotations

from celery import Celery

from console.boot import setup_django

setup_django()

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
