"""Through a real console worker process: a run goes queued -> running (progress written live)
-> succeeded; a worker killed mid-run leaves the run failed by the sweep, not running forever."""

from __future__ import annotations

import os
import signal

import pytest

from console.accounts.services import Actor
from console.benchmarks import services
from console.benchmarks.models import BenchmarkRun
from tests.console.benchmarks.conftest import BENCH
from tests.kit import FakeEngine, make_deployment, wait_for

pytestmark = pytest.mark.worker
PARAMS = {"prompt_tokens": 8, "output_tokens": 4, "concurrency": 2, "request_rate": None}


def status_of(run_id: int) -> BenchmarkRun:
    return BenchmarkRun.objects.get(pk=run_id)


def test_worker_runs_it_with_live_progress_and_a_killed_worker_fails_it(
    console_worker, operator, monkeypatch
):
    actor = Actor(user=operator, name="otto")
    with FakeEngine(ttft_s=0.05, itl_s=0.05) as engine:
        make_deployment("tiny", ports=[engine.port], **BENCH)
        run = services.start_run(actor=actor, deployment="tiny", params={**PARAMS, "duration_s": 4})
        live = wait_for(
            lambda: (r := status_of(run.pk)).status == "running" and r.requests > 0 and r,
            30,
            message="progress written while running",
        )
        assert live.heartbeat_at and live.timeline["t"] and live.elapsed_s < 4
        done = wait_for(
            lambda: (r := status_of(run.pk)).status not in ("queued", "running") and r,
            40,
            message="the run to end",
        )
        assert done.status == "succeeded", (done.reason, console_worker.output()[-3000:])
        assert done.requests == len(engine.requests) and done.ttft_p50_ms >= 50

        second = services.start_run(
            actor=actor, deployment="tiny", params={**PARAMS, "duration_s": 120}
        )
        wait_for(lambda: status_of(second.pk).requests > 0, 30, message="the second run")
        os.killpg(console_worker.popen.pid, signal.SIGKILL)  # the worker dies mid-run
        console_worker.popen.wait(10)
        monkeypatch.setattr(services, "STALE_AFTER_S", 2)
        wait_for(lambda: services.sweep_stale_runs(), 15, interval=0.5, message="the sweep")
        failed = status_of(second.pk)
        assert failed.status == "failed" and "stopped reporting" in failed.reason
        assert failed.finished_at and failed.requests > 0  # partial progress kept
