"""The host agent's Celery app: consumes `host.<node>`, sends to `console`. No Django here."""

from __future__ import annotations

from celery import Celery

from workers.config import AgentConfig
from workers.contracts import CONSOLE_QUEUE, Tasks, host_queue


def make_app(config: AgentConfig) -> Celery:
    app = Celery("workers", broker=config.broker_url, backend=config.broker_url)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_expires=3600,
        worker_prefetch_multiplier=1,
        task_default_queue=host_queue(config.node_name),
        task_routes={"console.*": {"queue": CONSOLE_QUEUE}},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.agent_config = config
    return app


def send_to_console(app: Celery, name: str, *args) -> None:
    """Fire-and-forget a console task (heartbeats, check results)."""
    app.send_task(name, args=list(args), queue=CONSOLE_QUEUE, ignore_result=True)


__all__ = ["make_app", "send_to_console", "Tasks"]
