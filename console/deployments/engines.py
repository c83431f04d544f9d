"""Between the console and the agents' engine supervisors: dispatch and reports."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from django.db import transaction
from pydantic import ValidationError

from console.deployments import scheduler
from console.deployments.models import Replica, ReplicaState
from console.deployments.services import transition_replica
from console.diagnosis.incidents import open_incident_for_replica
from console.hot import get_redis
from workers.contracts import EnginePhase, EngineReport, EngineSpec, Tasks, host_queue

log = logging.getLogger(__name__)
PHASE_TO_STATE = {
    EnginePhase.STARTING: ReplicaState.STARTING,
    EnginePhase.LOADING: ReplicaState.LOADING,
    EnginePhase.READY: ReplicaState.READY,
    EnginePhase.UNHEALTHY: ReplicaState.UNHEALTHY,
    EnginePhase.STOPPING: ReplicaState.STOPPING,
    EnginePhase.STOPPED: ReplicaState.STOPPED,
    EnginePhase.FAILED: ReplicaState.FAILED,
    EnginePhase.BACKOFF: ReplicaState.FAILED,
    EnginePhase.CRASH_LOOP: ReplicaState.CRASH_LOOP,
}
METRICS_TTL_S = 60
SERIES_POINTS = 720  # one hour of 5-second heartbeats


def series_key(replica_id: int) -> str:
    return f"npc:engine-series:{replica_id}"


def engine_charts(replica_id: int) -> list[dict]:
    """The replica's last hour from heartbeats: tokens/s, running/waiting, KV cache %, TTFT."""
    points = [json.loads(p) for p in get_redis().lrange(series_key(replica_id), 0, -1)]
    if len(points) < 2:
        return []
    xs = [int(datetime.fromisoformat(p["at"]).timestamp()) for p in points]
    gen = [p.get("generation_tokens_total") or 0 for p in points]
    rate = [None] + [
        max(0.0, (gen[i] - gen[i - 1]) / max(1, xs[i] - xs[i - 1])) for i in range(1, len(xs))
    ]

    def col(key, scale=1.0):
        return [None if p.get(key) is None else round(p[key] * scale, 3) for p in points]

    specs = [
        (
            "Output tokens/s",
            [{"label": "tokens/s", "values": [None if r is None else round(r, 2) for r in rate]}],
            "tok/s",
        ),
        (
            "Requests",
            [
                {"label": "running", "values": col("num_requests_running")},
                {"label": "waiting", "values": col("num_requests_waiting")},
            ],
            "",
        ),
        ("KV cache used %", [{"label": "KV %", "values": col("kv_cache_usage_perc", 100)}], "%"),
        (
            "Time to first token (s)",
            [
                {"label": "p50", "values": col("time_to_first_token_seconds_p50")},
                {"label": "p99", "values": col("time_to_first_token_seconds_p99")},
            ],
            "s",
        ),
    ]
    return [
        {"title": t, "json": json.dumps({"x": xs, "series": s, "yLabel": y})} for t, s, y in specs
    ]


def metrics_key(replica_id: int) -> str:
    return f"npc:engine:{replica_id}"


def build_spec(replica: Replica) -> EngineSpec:
    dep = replica.deployment
    chips = sorted(
        (a.accelerator for a in replica.allocations.select_related("accelerator")),
        key=lambda c: (c.npu_id, c.chip_id),
    )
    return EngineSpec(
        replica_id=replica.pk,
        generation=replica.generation,
        deployment=dep.name,
        model_path=dep.model_path,
        served_model_name=dep.served_model_name,
        port=replica.port,
        host="127.0.0.1" if dep.device == "cpu" else "0.0.0.0",  # noqa: S104 - engines serve the gateway
        npu_ids=[c.logic_id if c.logic_id is not None else c.npu_id for c in chips],
        device=dep.device,
        tensor_parallel_size=dep.tensor_parallel_size,
        pipeline_parallel_size=dep.pipeline_parallel_size,
        dtype=dep.dtype,
        max_model_len=dep.max_model_len,
        max_num_seqs=dep.max_num_seqs,
        max_num_batched_tokens=dep.max_num_batched_tokens,
        gpu_memory_utilization=(dep.gpu_memory_utilization if dep.device == "npu" else None),
        block_size=dep.block_size,
        swap_space=dep.swap_space,
        enforce_eager=dep.enforce_eager,
        quantization=dep.quantization or None,
        trust_remote_code=dep.trust_remote_code,
        extra_args=list(dep.extra_args),
        extra_env=dict(dep.extra_env),
    )


def send_on_commit(task: str, args: list, node_name: str) -> None:
    """Send a host task to the node's queue once the current transaction commits."""

    def send():
        from console.celery import app

        app.send_task(task, args=args, queue=host_queue(node_name), ignore_result=True)

    transaction.on_commit(send)


def dispatch_start(replica: Replica) -> None:
    """Start (or replace) the replica's engine. Idempotent on the agent per generation."""
    send_on_commit(
        Tasks.HOST_START_REPLICA, [build_spec(replica).model_dump(mode="json")], replica.node.name
    )


def dispatch_stop(node_name: str, replica_id: int, generation: int | None) -> None:
    """Stop the replica's engine (idempotent on the agent)."""
    send_on_commit(Tasks.HOST_STOP_REPLICA, [replica_id, generation], node_name)


def apply_report(payload: dict) -> Replica | None:
    """Apply an agent's engine report to its replica (idempotent; stale generations ignored)."""
    try:
        report = EngineReport.model_validate(payload)
    except ValidationError as exc:
        log.warning("engine report refused: %s", exc.errors()[0].get("msg"))
        return None
    with transaction.atomic():
        replica = (
            Replica.objects.select_for_update(of=("self",))
            .select_related("node", "deployment")
            .filter(pk=report.replica_id)
            .order_by()
            .first()
        )
        if replica is None or replica.node is None or replica.node.name != report.node:
            if report.phase not in (
                EnginePhase.STOPPED,
                EnginePhase.CRASH_LOOP,
                EnginePhase.FAILED,
            ):
                log.warning(
                    "engine %s on %s belongs to no replica here: stopping it",
                    report.replica_id,
                    report.node,
                )
                dispatch_stop(report.node, report.replica_id, None)
            return None
        if report.generation < replica.generation:
            return replica  # an older engine of this replica: the agent replaces it
        if report.generation == replica.generation and _older_than_applied(report):
            return replica  # older than what we already know (e.g. a heartbeat's snapshot)
        _apply(replica, report)
        _remember_applied(report)
    if report.metrics:
        get_redis().set(
            metrics_key(replica.pk),
            json.dumps({"at": report.at.isoformat(), **report.metrics}),
            ex=METRICS_TTL_S,
        )
    return replica


def _applied_key(replica_id: int) -> str:
    return f"npc:engine-applied:{replica_id}"


def _older_than_applied(report: EngineReport) -> bool:
    """True when a report of this generation made later (by the same agent's clock) was
    already applied. Agent time is compared with agent time only: a host's clock may be
    behind the console's, and two reports a few ms apart (failed, then crash-loop) must both
    count. Unknown (Redis down or restarted): not older."""
    try:
        seen = get_redis().get(_applied_key(report.replica_id))
    except Exception:  # noqa: BLE001 - the hot store is an optimisation here, not the truth
        return False
    if not seen:
        return False
    generation, at = seen.decode().split(" ", 1)
    return int(generation) == report.generation and report.at < datetime.fromisoformat(at)


def _remember_applied(report: EngineReport) -> None:
    try:
        value = f"{report.generation} {report.at.isoformat()}"
        get_redis().set(_applied_key(report.replica_id), value, ex=7 * 86400)
    except Exception:  # noqa: BLE001
        log.warning("could not remember the last applied report of %s", report.replica_id)


def _apply(replica: Replica, report: EngineReport) -> None:
    to = PHASE_TO_STATE.get(report.phase)
    if to is None:
        return
    reason = report.reason or report.phase
    fields = {"pid": report.pid, "restarts": report.restarts, "exit_code": report.exit_code}
    if report.log_path:
        fields["log_path"] = report.log_path
    if report.log_tail:
        fields["log_tail"] = report.log_tail[-50:]
    if to == replica.state:
        Replica.objects.filter(pk=replica.pk).update(**fields)
        return
    if transition_replica(replica, to, reason, **fields) and to == ReplicaState.STOPPED:
        scheduler.release(replica)
        Replica.objects.filter(pk=replica.pk).update(pid=None)
    if to in (ReplicaState.FAILED, ReplicaState.CRASH_LOOP, ReplicaState.UNHEALTHY):
        on_failure(replica, report)


def on_failure(replica: Replica, report: EngineReport) -> None:
    """Hook for diagnosis: runs on every failed start, crash and unhealthy transition."""
    log.info("replica %s %s: %s", replica, report.phase, report.reason)
    open_incident_for_replica(replica, report)  # logs and returns None on any failure


def engine_metrics(replica_ids: list[int]) -> dict[int, dict]:
    if not replica_ids:
        return {}
    values = get_redis().mget([metrics_key(i) for i in replica_ids])
    return {i: json.loads(v) for i, v in zip(replica_ids, values, strict=True) if v}


def now() -> datetime:
    return datetime.now(UTC)
