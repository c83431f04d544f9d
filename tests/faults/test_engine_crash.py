"""An engine killed with SIGKILL: noticed within one probe interval, restarted after a
doubling backoff, and given up on (crash-loop) after K crashes; the incident says so.

Real processes throughout: a console worker, a host agent and its supervisor, the stand-in
engine (an HTTP server answering /health like vLLM's) killed by the test with SIGKILL.
Promise: docs/faults.md "Engine killed".
"""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime

import pytest

from console.deployments.models import Replica, ReplicaEvent
from console.deployments.reconcile import reconcile
from console.diagnosis.models import Incident
from console.inventory.models import Node
from tests.faults.conftest import BACKOFF_S, PROBE_S, cpu_deployment
from tests.helpers import wait_for
from workers.contracts import EngineSpec

pytestmark = [pytest.mark.faults, pytest.mark.worker]
K = EngineSpec.model_fields["restart_max"].default  # crashes before crash-loop
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?replica (\d+)(?: gen \d+)?: (\S+)")


def agent_events(output: str, replica_id: int) -> list[tuple[float, str]]:
    """(unix time, word) of the agent's "replica N gen G: <phase>" and "replica N: started"
    log lines, in order."""
    found = []
    for line in output.splitlines():
        m = _LINE.match(line)
        if m and int(m[2]) == replica_id:
            at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time
            found.append((at, m[3]))
    return found


def running_pid(replica_id: int, not_in: set[int]) -> int | None:
    r = Replica.objects.get(pk=replica_id)
    if r.state in ("starting", "loading", "ready") and r.pid and r.pid not in not_in:
        return r.pid
    return None


def test_sigkilled_engine_is_detected_restarted_with_backoff_then_crash_loops(
    console_worker, stand_in_agent, model_dir
):
    agent = stand_in_agent("fault-crash")
    cpu_deployment("crashy", Node.objects.get(name="fault-crash"), model_dir)
    reconcile()
    replica = Replica.objects.get(deployment__name="crashy")
    wait_for(
        lambda: Replica.objects.filter(pk=replica.pk, state="ready").exists(),
        60,
        message="the stand-in engine to be ready",
    )
    kills: list[float] = []
    killed: set[int] = set()
    try:
        for n in range(K):
            pid = wait_for(
                lambda: running_pid(replica.pk, killed), 60, message=f"run {n + 1} of the engine"
            )
            kills.append(time.time())
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        wait_for(
            lambda: Replica.objects.filter(pk=replica.pk, state="crash-loop").exists(),
            60,
            message="crash-loop",
        )
    except AssertionError:
        print("--- agent ---\n", agent.output()[-6000:])
        raise

    events = agent_events(agent.output(), replica.pk)
    failed = [at for at, word in events if word == "failed"]
    started = [at for at, word in events if word == "started"]
    assert len(failed) == K and len(started) == K, events  # the first run + K-1 restarts
    detection = [f - k for f, k in zip(failed, kills, strict=True)]
    assert max(detection) <= PROBE_S + 0.5, f"detected after {detection}"
    gaps = [s - f for f, s in zip(failed, started[1:], strict=False)]
    delays = [BACKOFF_S * 2**i for i in range(K - 1)]
    for gap, delay in zip(gaps, delays, strict=True):
        assert delay - 0.05 <= gap <= delay + PROBE_S + 0.5, f"backoff gaps {gaps}, want {delays}"
    print(
        "\ndetection",
        [round(d, 2) for d in detection],
        "s; backoff gaps",
        [round(g, 2) for g in gaps],
    )

    replica.refresh_from_db()
    assert replica.restarts == K - 1
    assert f"{K} crash(es) within" in replica.state_reason and "SIGKILL" in replica.state_reason
    to_states = list(
        ReplicaEvent.objects.filter(replica=replica).values_list("to_state", flat=True)
    )
    assert to_states.count("failed") == K and to_states[-1] == "crash-loop"
    assert not any(p.is_running() for p in map(_proc, killed) if p)  # nothing restarted it
    incident = wait_for(
        lambda: Incident.objects.filter(
            replica=replica, notes__text__contains="crash-loop"
        ).first(),
        30,
        message="the incident to say crash-loop",
    )
    assert incident.status == "open" and incident.severity == "critical"
    assert incident.count >= K
    note = incident.notes.get(text__contains="crash-loop").text
    assert f"{K} crash(es)" in note


def _proc(pid: int):
    import psutil

    try:
        p = psutil.Process(pid)
        return p if p.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None
