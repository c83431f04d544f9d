"""The console's Celery app: consumes queue `console` (heartbeats, reconcile, beat jobs).

Run with `celery -A console worker -Q console` and `celery -A console beat`.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from console.boot import setup_django

setup_django()

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# The inbound channel's consumer (console/inventory/inbox.py) runs in every console worker's
# main process, outside the task pool: heartbeats and engine reports never wait for a worker
# slot, and benchmarks or webhooks never delay them. One worker at a time holds its lease.
_inbox_stop = None


@worker_ready.connect
def _start_inbox(sender=None, **kwargs) -> None:
    global _inbox_stop
    from django.conf import settings

    if not getattr(settings, "INBOX_IN_WORKER", True) or _inbox_stop is not None:
        return
    import threading

    from console.inventory.inbox import start_thread

    _inbox_stop = threading.Event()
    start_thread(_inbox_stop)


@worker_shutdown.connect
def _stop_inbox(sender=None, **kwargs) -> None:
    if _inbox_stop is not None:
        _inbox_stop.set()
