"""`manage.py inbox`: run the inbound channel's consumer on its own (console workers also run
it in a thread; one at a time holds the lease, so running both is safe)."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand

from console.inventory.inbox import Consumer


class Command(BaseCommand):
    help = "Consume npc:inbox (signed agent messages) and enrollment requests until SIGTERM."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--batch", type=int, default=500, help="messages per batch")

    def handle(self, *args, **options) -> None:
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        Consumer(batch=options["batch"]).run(stop)
