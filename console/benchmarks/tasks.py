"""Console-side tasks of benchmark runs (execute: queue `console.jobs`; sweep: beat, queue
`console`). Thin: the logic is in services."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="benchmarks.execute", ignore_result=True)
def execute(run_id: int) -> str:
    """Run a queued benchmark to its end. Holds one worker slot for the run's duration.
    Idempotent (a run no longer queued is skipped), but not acks_late: a redelivery after a
    worker crash would re-measure; the stale-run sweep fails such a run instead."""
    from console.benchmarks.services import execute_run

    return execute_run(run_id)


@shared_task(name="benchmarks.sweep", ignore_result=True)
def sweep() -> int:
    """Beat job: fail runs whose worker stopped reporting, and queued runs nobody started."""
    from console.benchmarks.services import sweep_stale_runs

    return sweep_stale_runs()
