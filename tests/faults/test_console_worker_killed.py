"""The console's worker is SIGKILLed in the middle of applying an engine report (read from the
signed inbound channel by its inbox consumer): the batch it held is handled again by the next
worker once the dead one's lease lapses, and applied once — one state change, one event.

Real processes: two console workers one after the other, the broker (embedded or REDIS_URL),
the test database. "Mid-task" is made certain, not timed: the test holds a lock the task
needs (the replica's row on PostgreSQL, the write lock on SQLite), so the task has started
and cannot finish when the worker dies. Promise: docs/faults.md "Console worker killed".
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from datetime import UTC, datetime

import psycopg
import pytest
from django.db import connection

from console.deployments.models import Replica, ReplicaEvent
from console.deployments.reconcile import reconcile
from console.hot import get_redis
from console.inventory.inbox import PROCESSING_KEY
from console.inventory.models import Node
from tests.conftest import start_console_worker
from tests.factories import make_node
from tests.faults.conftest import cpu_deployment
from tests.helpers import wait_for
from tests.node_support import enroll_node, sealed
from workers import channel
from workers.contracts import Tasks

pytestmark = [pytest.mark.faults, pytest.mark.worker]


class RowLock:
    """Hold what apply_report needs, from outside Django's connection."""

    def __init__(self, replica_id: int) -> None:
        s = connection.settings_dict
        self.held = True
        if connection.vendor == "sqlite":
            self.conn = sqlite3.connect(s["NAME"], isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")  # the database's single write lock
        else:
            self.conn = psycopg.connect(
                host=s.get("HOST") or "127.0.0.1",
                port=s.get("PORT") or 5432,
                user=s.get("USER") or "postgres",
                password=s.get("PASSWORD") or None,
                dbname=s["NAME"],
            )
            self.conn.execute(
                "SELECT id FROM deployments_replica WHERE id = %s FOR UPDATE", [replica_id]
            )

    def someone_waits(self) -> bool:
        """On PostgreSQL: another session is blocked on a lock (our row). SQLite cannot say."""
        if connection.vendor == "sqlite":
            return True
        with psycopg.connect(self.conn.info.dsn, autocommit=True) as other:
            row = other.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                [connection.settings_dict["NAME"]],
            ).fetchone()
        return row[0] > 0

    def release(self) -> None:
        if self.held:
            self.held = False
            self.conn.rollback()  # sqlite3 and psycopg alike
            self.conn.close()


def test_a_worker_killed_mid_report_leaves_it_to_the_next_worker_applied_once(
    redis_url, transactional_db, tmp_path
):
    node = make_node("fault-worker")
    identity = enroll_node(node.name)
    dep = cpu_deployment("redeliver", node, tmp_path)
    with pytest.MonkeyPatch.context() as mp:  # schedule without sending a start to no agent
        mp.setattr("console.deployments.reconcile.dispatch_start", lambda replica: None)
        reconcile()
    replica = Replica.objects.get(deployment=dep)
    Replica.objects.filter(pk=replica.pk).update(state="starting")
    first = start_console_worker(redis_url, tmp_path / "worker-1.log")
    lock = RowLock(replica.pk)
    second = None
    try:
        report = {
            "node": node.name,
            "replica_id": replica.pk,
            "generation": replica.generation,
            "phase": "ready",
            "reason": "/v1/models lists tiny",
            "pid": 4242,
            "at": datetime.now(UTC).isoformat(),
        }
        get_redis().rpush(channel.INBOX_KEY, sealed(identity, Tasks.ENGINE_REPORT, report))
        wait_for(lambda: get_redis().llen(PROCESSING_KEY) == 1, 30, message="taken in a batch")
        wait_for(lock.someone_waits, 30, message="the report to wait on the lock")
        os.killpg(first.popen.pid, signal.SIGKILL)
        first.popen.wait()
        killed_at = time.monotonic()
        lock.release()
        assert get_redis().llen(PROCESSING_KEY) == 1  # the batch is still there
        assert Replica.objects.get(pk=replica.pk).state == "starting"  # nothing half-applied

        second = start_console_worker(redis_url, tmp_path / "worker-2.log")
        wait_for(
            lambda: Replica.objects.filter(pk=replica.pk, state="ready").exists(),
            60,
            interval=0.2,
            message="the report to be delivered again and applied",
        )
        print(f"\nredelivered and applied {time.monotonic() - killed_at:.1f}s after the kill")
        wait_for(lambda: get_redis().llen(PROCESSING_KEY) == 0, 10, message="the batch done")
        events = ReplicaEvent.objects.filter(replica=replica, to_state="ready")
        assert events.count() == 1 and Replica.objects.get(pk=replica.pk).pid == 4242
        assert Node.objects.filter(name=node.name).exists()
    except AssertionError:
        print("--- worker 1 ---\n", first.output()[-3000:])
        print("--- worker 2 ---\n", second.output()[-3000:] if second else "")
        raise
    finally:
        lock.release()
        first.stop()
        if second is not None:
            second.stop()
