"""Writes to benchmark runs: start, cancel, execute (on the console worker), sweep, compare."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.benchmarks.models import ACTIVE, METRICS, RUN_TRANSITIONS, BenchmarkRun, RunStatus
from console.benchmarks.runner import LoadParams, LoadRun
from console.deployments.models import Deployment, Replica, ReplicaState, engine_api_key
from console.deployments.services import SPEC_FIELDS, get_deployment
from console.errors import Conflict, Invalid, NotFound
from workers.contracts import JOBS_QUEUE
from workers.engine.argv import redact_argv, redact_env

log = logging.getLogger(__name__)
PARAM_FIELDS = (
    "prompt_tokens",
    "output_tokens",
    "concurrency",
    "request_rate",
    "duration_s",
    "max_requests",
    "seed",
)
TICK_S = 1.0  # progress is written (and cancels noticed) this often
STALE_AFTER_S = 30  # a running run without a progress write this long has lost its worker
QUEUED_TOO_LONG_S = 600  # a queued run no worker took this long is failed
RESULT_FIELDS = (
    "duration_measured_s",
    "req_per_s",
    "output_tokens_per_s",
    "output_tokens_total",
    "prompt_tokens_mean",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "requests",
    "errors",
    "unfinished",
    "error_samples",
)


def get_run(run_id: int) -> BenchmarkRun:
    run = BenchmarkRun.objects.select_related("deployment", "created_by").filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"no benchmark run with id {run_id}", field="run_id")
    return run


def ready_replicas(dep: Deployment) -> list[Replica]:
    """The replicas a run can load: ready, with a port, and not on a SIMULATED node (the agent
    simulates those engines: nothing answers on their ports)."""
    return list(
        dep.replica_set.filter(state=ReplicaState.READY, port__isnull=False)
        .exclude(node__simulated=True)
        .select_related("node", "deployment")
        .order_by("index")
    )


def replica_base_url(replica: Replica) -> str | None:
    """Where the console reaches a replica's OpenAI server: Replica.base_url (the node's IP
    address, loopback for CPU engines), None when its node reports no usable address."""
    return replica.base_url


def engine_snapshot(dep: Deployment) -> dict:
    """The deployment's spec as a flat dict, secrets redacted: what a compare diffs."""
    snap = {key: getattr(dep, key) for key in SPEC_FIELDS}
    snap["extra_args"] = redact_argv(list(dep.extra_args or []))
    snap["extra_env"] = redact_env(dict(dep.extra_env or {}))
    snap["spec_version"] = dep.spec_version
    snap["pinned_node"] = dep.pinned_node.name if dep.pinned_node_id else None
    return snap


def check_params(dep: Deployment, params: dict) -> dict:
    """Cross-field rules (ranges are the schema's): exactly one load shape; the request fits."""
    has_c, has_r = params.get("concurrency") is not None, params.get("request_rate") is not None
    if has_c == has_r:
        raise Invalid("give either concurrency or request_rate (one of them)", field="concurrency")
    total = params["prompt_tokens"] + params["output_tokens"]
    if dep.max_model_len and total > dep.max_model_len:
        raise Invalid(
            f"prompt_tokens + output_tokens = {total} is more than the deployment's "
            f"max_model_len {dep.max_model_len}",
            field="prompt_tokens",
        )
    return {k: params.get(k) for k in PARAM_FIELDS}


def start_run(*, actor: Actor, deployment: str, params: dict) -> BenchmarkRun:
    """Queue a run (409 when no replica is ready or one is already running); the console
    worker picks it up after the commit. Audited."""
    check_role(actor, Role.OPERATOR)
    dep = get_deployment(deployment)
    clean = check_params(dep, params)
    if not ready_replicas(dep):
        ready = dep.replica_set.filter(state=ReplicaState.READY, node__simulated=True)
        why = " (its ready replicas are SIMULATED: no engine answers)" if ready.exists() else ""
        raise Conflict(f"{dep.name} has no ready replica to load{why}", field="deployment")
    with transaction.atomic():
        Deployment.objects.select_for_update().filter(pk=dep.pk).first()  # one start at a time
        if dep.benchmark_runs.filter(status__in=ACTIVE).exists():
            raise Conflict(
                f"a benchmark of {dep.name} is already queued or running; two at once would "
                "measure each other",
                field="deployment",
            )
        run = BenchmarkRun.objects.create(
            deployment=dep, created_by=actor.user, engine_settings=engine_snapshot(dep), **clean
        )
        record(actor=actor, action="benchmark.start", obj=run, after=clean)
        transaction.on_commit(lambda: _dispatch(run.pk))
    return run


def _dispatch(run_id: int) -> None:
    # Sent through the console's own app, not a shared_task proxy: the proxy follows Celery's
    # "current app", which is whichever app was created last in the process (an in-process
    # agent's, in tests) and would send the run to that app's broker.
    from console.celery import app

    app.send_task(
        "benchmarks.execute",
        args=[run_id],
        queue=JOBS_QUEUE,  # its own worker: a run holds a slot for minutes
        ignore_result=True,
    )


def transition(run_id: int, to: str, *, reason: str = "", **fields) -> bool:
    """Move a run to `to` if its current state allows it: one conditional UPDATE. False when
    another writer got there first (e.g. a cancel raced the end of the run)."""
    sources = [s for s, targets in RUN_TRANSITIONS.items() if to in targets]
    if to not in ACTIVE:
        fields.setdefault("finished_at", timezone.now())
    updated = BenchmarkRun.objects.filter(pk=run_id, status__in=sources).update(
        status=to, reason=reason[:500], **fields
    )
    return updated == 1


def cancel_run(*, actor: Actor, run_id: int) -> BenchmarkRun:
    """Cancel a queued or running run; a running one stops within about a second. Audited."""
    check_role(actor, Role.OPERATOR)
    run = get_run(run_id)
    with transaction.atomic():
        if not transition(run.pk, RunStatus.CANCELLED, reason=f"cancelled by {actor.name}"):
            raise Conflict(f"the run is already {get_run(run_id).status}", field="run_id")
        record(actor=actor, action="benchmark.cancel", obj=run)
    return get_run(run_id)


def execute_run(run_id: int) -> str:
    """The worker's side: queued -> running -> succeeded/failed (or stays cancelled).

    Idempotent: a run that is no longer queued is left alone (a redelivered task does nothing).
    Progress and a heartbeat are written every TICK_S; results are kept also for a cancel.
    """
    run = get_run(run_id)
    replicas = [r for r in ready_replicas(run.deployment) if replica_base_url(r) is not None]
    now = timezone.now()
    if not replicas:
        transition(run_id, RunStatus.FAILED, reason="no ready replica when the run started")
        return "failed"
    # The targets are stored and shown; the engine keys are not (they go with the requests).
    targets = [
        {"replica": r.pk, "index": r.index, "node": r.node.name if r.node else None}
        | {"url": replica_base_url(r), "generation": r.generation}
        for r in replicas
    ]
    if not transition(
        run_id,
        RunStatus.RUNNING,
        started_at=now,
        heartbeat_at=now,
        targets=targets,
        engine_settings=engine_snapshot(run.deployment),
    ):
        return "skipped"
    params = LoadParams(
        model=run.deployment.served_model_name,
        **{k: getattr(run, k) for k in PARAM_FIELDS},
    )
    keys = [engine_api_key(r.pk) for r in replicas]
    load = LoadRun(params, [t["url"] for t in targets], keys).start()
    status = _watch(run_id, load)
    return _finish(run_id, load, status)


def _watch(run_id: int, load: LoadRun) -> str:
    """Write progress every tick until the load ends; stop it when the run was cancelled."""
    while not load.join(TICK_S):
        p = load.snapshot()
        BenchmarkRun.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
            requests=p.requests,
            errors=p.errors,
            in_flight=p.in_flight,
            elapsed_s=p.elapsed_s,
            heartbeat_at=timezone.now(),
            timeline=load.recorder.timeline(),
        )
        status = BenchmarkRun.objects.filter(pk=run_id).values_list("status", flat=True).first()
        if status != RunStatus.RUNNING:  # cancelled (or swept): stop sending at once
            load.stop()
            load.join(30)
            return status or "gone"
    return RunStatus.RUNNING


def _finish(run_id: int, load: LoadRun, status: str) -> str:
    results = load.recorder.results()
    fields = {k: results[k] for k in RESULT_FIELDS}
    fields.update(
        timeline=load.recorder.timeline(),
        in_flight=0,
        elapsed_s=load.snapshot().elapsed_s,
        heartbeat_at=timezone.now(),
    )
    if status != RunStatus.RUNNING:  # cancelled meanwhile: keep what was measured
        BenchmarkRun.objects.filter(pk=run_id).update(**fields)
        return status
    if load.error is not None:
        reason = f"the load client crashed: {type(load.error).__name__}: {load.error}"
        transition(run_id, RunStatus.FAILED, reason=reason, **fields)
        return RunStatus.FAILED
    if results["requests"] == 0:
        first = (results["error_samples"] or ["no request finished"])[0]
        transition(run_id, RunStatus.FAILED, reason=f"no request succeeded: {first}", **fields)
        return RunStatus.FAILED
    transition(run_id, RunStatus.SUCCEEDED, **fields)
    return RunStatus.SUCCEEDED


def sweep_stale_runs() -> int:
    """Fail runs whose worker went away (no progress for STALE_AFTER_S) and queued runs no
    worker picked up: none stays `running` forever. Idempotent; returns how many it failed."""
    now = timezone.now()
    stale = BenchmarkRun.objects.filter(
        status=RunStatus.RUNNING, heartbeat_at__lt=now - timedelta(seconds=STALE_AFTER_S)
    ).values_list("pk", flat=True)
    lost = BenchmarkRun.objects.filter(
        status=RunStatus.QUEUED, created_at__lt=now - timedelta(seconds=QUEUED_TOO_LONG_S)
    ).values_list("pk", flat=True)
    count = 0
    for pk in list(stale):
        count += transition(
            pk,
            RunStatus.FAILED,
            reason=f"the console worker stopped reporting progress for over {STALE_AFTER_S} s "
            "(crashed or restarted mid-run); partial progress is kept",
        )
    for pk in list(lost):
        count += transition(
            pk,
            RunStatus.FAILED,
            reason=f"no console worker started the run within {QUEUED_TOO_LONG_S // 60} min",
        )
    if count:
        log.warning("benchmarks: failed %d stale run(s)", count)
    return count


def compare_runs(a: BenchmarkRun, b: BenchmarkRun) -> dict:
    """Metric deltas (b relative to a) and the engine settings that differ."""
    metrics = []
    for key, label, unit, higher_better in METRICS:
        va, vb = getattr(a, key), getattr(b, key)
        delta = pct = None
        if va is not None and vb is not None:
            delta = round(vb - va, 3)
            pct = round(100 * delta / va, 1) if va else None
        better = None if not delta else (delta > 0) == higher_better
        metrics.append(
            {"key": key, "label": label, "unit": unit, "a": va, "b": vb}
            | {"delta": delta, "delta_pct": pct, "better": better}
        )
    sa, sb = a.engine_settings or {}, b.engine_settings or {}
    settings_diff = [
        {"key": k, "a": sa.get(k), "b": sb.get(k)}
        for k in sorted(set(sa) | set(sb))
        if sa.get(k) != sb.get(k)
    ]
    params_diff = [
        {"key": k, "a": getattr(a, k), "b": getattr(b, k)}
        for k in PARAM_FIELDS
        if getattr(a, k) != getattr(b, k)
    ]
    return {"metrics": metrics, "settings_diff": settings_diff, "params_diff": params_diff}
