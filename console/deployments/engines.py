"""Between the console and the agents' engine supervisors: dispatch and reports."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

from django.db import transaction
from pydantic import ValidationError

from console.deployments import groups, numa, scheduler
from console.deployments.models import Replica, ReplicaState, engine_api_key
from console.deployments.services import transition_replica
from console.diagnosis.incidents import open_incident_for_replica
from console.hot import get_redis
from console.inventory import ports
from console.inventory.commands import send_on_commit
from workers import engine_settings
from workers.contracts import (
    MAX_ENGINES,
    EnginePhase,
    EngineReport,
    EngineSpec,
    Tasks,
    describe,
    fit_metrics,
)
from workers.engine.shipper import strip_controls

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
SERIES_TTL_S = 3600  # a replica gone for an hour leaves no series behind


def series_key(replica_id: int) -> str:
    return f"npc:engine-series:{replica_id}"


def record_point(pipe, replica_id: int, point: str) -> None:
    """Append one heartbeat's metrics to the replica's last hour (in the caller's pipeline)."""
    key = series_key(replica_id)
    pipe.rpush(key, point)
    pipe.ltrim(key, -SERIES_POINTS, -1)
    pipe.expire(key, SERIES_TTL_S)


def series_points(replica_id: int, since: float = 0.0) -> list[dict]:
    """The replica's stored points from `since` (a Unix time) on, oldest first, each with
    its time as `ts` and its finite non-negative numbers; unreadable points are skipped."""
    raws = get_redis().lrange(series_key(replica_id), 0, -1)
    points = [p for p in map(_chart_point, raws) if p is not None and p["ts"] >= since]
    return sorted(points, key=lambda p: p["ts"])  # heartbeats may land out of order


def _chart_point(raw: bytes) -> dict | None:
    """One stored point: its time as `ts` and its finite non-negative numbers; None when
    unreadable (skipped: a bad point must not fail the page)."""
    try:
        doc = json.loads(raw)
        ts = int(datetime.fromisoformat(doc["at"]).timestamp())
    except (ValueError, TypeError, KeyError, OverflowError):
        return None
    return {**fit_metrics(doc), "ts": ts}


def engine_charts(replica_id: int) -> list[dict]:
    """The replica's last hour from heartbeats: tokens/s, running/waiting, KV cache %, TTFT."""
    points = series_points(replica_id)
    if len(points) < 2:
        return []
    xs = [p["ts"] for p in points]
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


def build_spec(replica: Replica, member=None, leader=None) -> EngineSpec:
    """The spec dispatched to the replica's agent (for a multi-host replica: to one member's,
    with its place in the group). It carries the replica's engine key: dispatch it, never
    show or log it (EngineSpec keeps it out of its repr)."""
    dep = replica.deployment
    node = member.node if member is not None else replica.node
    chips = sorted(
        (
            a.accelerator
            for a in replica.allocations.select_related("accelerator")
            if node is None or a.accelerator.node_id == node.pk
        ),
        key=lambda c: (c.npu_id, c.chip_id),
    )
    group = {}
    if member is not None:
        # a member is never restarted alone: the console restarts the whole group
        group = {"group": groups.group_spec(replica, member, leader), "restart_max": 0}
    return EngineSpec(
        replica_id=replica.pk,
        generation=replica.generation,
        node=node.name if node else None,
        deployment=dep.name,
        model_path=dep.model_path,
        served_model_name=dep.served_model_name,
        port=replica.port,
        host="127.0.0.1" if dep.device == "cpu" else "0.0.0.0",  # noqa: S104 - engines serve the gateway
        npu_ids=[c.logic_id if c.logic_id is not None else c.npu_id for c in chips],
        device=dep.device,
        **{name: getattr(dep, name) for name in engine_settings.NAMES},  # the one table
        extra_args=list(dep.extra_args),
        extra_env=dict(dep.extra_env),
        api_key=engine_api_key(replica.pk),  # the engine refuses /v1 without it
        numa_nodes=_numa_nodes(replica, chips, node),
        **group,
    )


def _numa_nodes(replica: Replica, chips: list, node=None) -> list[int]:
    """The NUMA nodes the engine on `node` (the replica's, or a member's) is bound to
    (cpu_binding "numa"), [] for none."""
    dep, node = replica.deployment, node or replica.node
    if dep.cpu_binding != numa.NUMA or dep.device != "npu" or node is None:
        return []
    return numa.replica_numa(node, chips)[0]


def dispatch_start(replica: Replica) -> None:
    """Start (or replace) the replica's engine once the transaction commits (a signed command
    for its node; for a multi-host replica, one for every member, each with its place in the
    group). Idempotent on the agent per generation. Raises groups.NoNetworkFacts when a
    member's host has not reported what the group needs (nothing is sent then)."""
    if not groups.is_group(replica):
        return _send_start(replica.node.name, build_spec(replica))
    members = groups.members(replica)
    specs = [(m.node.name, build_spec(replica, m, members[0])) for m in members]
    for node, spec in specs:
        _send_start(node, spec)


def _send_start(node: str, spec: EngineSpec) -> None:
    # unset optional fields and engine settings at their table default are left out (the
    # agent fills the same defaults), so an agent one minor version older — supported by the
    # skew policy (inventory/models.py) — whose EngineSpec predates a field still takes the
    # spec while that field is not used
    unset = {name for name in ("numa_nodes", "group") if not getattr(spec, name, None)}
    unset |= {row.name for row in engine_settings.ROWS if getattr(spec, row.name) == row.default}
    send_on_commit(
        node, Tasks.HOST_START_REPLICA, [spec.model_dump(mode="json", exclude=unset or None)]
    )


def dispatch_stop(node_name: str, replica_id: int, generation: int | None) -> None:
    """Stop the replica's engine once the transaction commits (idempotent on the agent)."""
    send_on_commit(node_name, Tasks.HOST_STOP_REPLICA, [replica_id, generation])


def dispatch_stop_replica(replica: Replica) -> None:
    """Stop the replica's engine on its node, or on every member's host."""
    nodes = [m.node.name for m in groups.members(replica)] if groups.is_group(replica) else []
    for node in nodes or ([replica.node.name] if replica.node else []):
        dispatch_stop(node, replica.pk, replica.generation)


def apply_report(payload: dict, *, node: str) -> Replica | None:
    """Apply an engine report of `node` (the identity its signature proved) to its replica:
    only a replica placed on that node is changed (NodeRestriction); for any other the node is
    only asked to stop the engine. Idempotent; stale generations ignored."""
    try:
        report = EngineReport.model_validate({**payload, "node": node})
    except ValidationError as exc:
        log.warning("engine report from %s refused: %s", node, describe(exc))
        return None
    # a host's words are stored and shown: no terminal escape or control character (NUL
    # included, which PostgreSQL's JSON refuses) travels with them
    report = report.model_copy(
        update={
            "reason": strip_controls(report.reason) if report.reason else report.reason,
            "log_tail": [strip_controls(line) for line in report.log_tail or []],
        }
    )
    with transaction.atomic():
        replica = (
            Replica.objects.select_for_update(of=("self",))
            .select_related("node", "deployment")
            .filter(pk=report.replica_id)
            .order_by()
            .first()
        )
        member = (
            groups.record_member_report(replica, report.node, report)
            if replica is not None and groups.is_group(replica)
            else None
        )
        placed_here = replica is not None and replica.node is not None
        placed_here = placed_here and (replica.node.name == report.node or member is not None)
        if not placed_here:
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
        if member is None:
            failed = _apply(replica, report)
        else:
            failed = _apply_member(replica, member, report)
        _remember_applied(report)
    if failed:  # diagnosed outside the transaction: the row lock is not held while matching
        on_failure(replica, report)
    if report.metrics:
        get_redis().set(
            metrics_key(replica.pk),
            json.dumps({"at": report.at.isoformat(), **report.metrics}),
            ex=METRICS_TTL_S,
        )
    return replica


def _applied_key(report: EngineReport) -> str:
    """Per replica and reporting node: the members of a multi-host replica each have their
    own clock, and their reports are ordered among themselves only."""
    return f"npc:engine-applied:{report.replica_id}:{report.node}"


def _older_than_applied(report: EngineReport) -> bool:
    """True when a report of this generation made later (by the same agent's clock) was
    already applied. Agent time is compared with agent time only: a host's clock may be
    behind the console's, and two reports a few ms apart (failed, then crash-loop) must both
    count. Unknown (Redis down or restarted): not older."""
    try:
        seen = get_redis().get(_applied_key(report))
    except Exception:  # noqa: BLE001 - the hot store is an optimisation here, not the truth
        return False
    if not seen:
        return False
    generation, at = seen.decode().split(" ", 1)
    return int(generation) == report.generation and report.at < datetime.fromisoformat(at)


def _remember_applied(report: EngineReport) -> None:
    try:
        value = f"{report.generation} {report.at.isoformat()}"
        get_redis().set(_applied_key(report), value, ex=7 * 86400)
    except Exception:  # noqa: BLE001
        log.warning("could not remember the last applied report of %s", report.replica_id)


def _apply(replica: Replica, report: EngineReport, group: bool = False) -> bool:
    """Apply the report's state; True when it is a failure to diagnose (after the commit).
    `group`: a multi-host leader's report, whose restart count is the console's (the group's),
    not the agent's."""
    to = PHASE_TO_STATE.get(report.phase)
    if to is None:
        return False
    # a host's words reach pages and logs: no terminal escape sequence travels with them
    reason = strip_controls(report.reason or report.phase)
    fields = {"pid": report.pid, "exit_code": report.exit_code}
    if not group:
        fields["restarts"] = report.restarts
    if report.log_path:
        fields["log_path"] = report.log_path
    if report.log_tail:
        fields["log_tail"] = report.log_tail[-50:]
    # a draining replica's engine still serves (reports ready) until the rollout stops it
    if to == replica.state or (to == ReplicaState.READY and replica.state == ReplicaState.DRAINING):
        Replica.objects.filter(pk=replica.pk).update(**fields)
        return False
    if to == ReplicaState.FAILED and _replace_busy_port(replica, report, reason, fields):
        return False
    if transition_replica(replica, to, reason, **fields) and to == ReplicaState.STOPPED:
        scheduler.release(replica)
        Replica.objects.filter(pk=replica.pk).update(pid=None)
    return to in (ReplicaState.FAILED, ReplicaState.CRASH_LOOP, ReplicaState.UNHEALTHY)


def _apply_member(replica: Replica, member, report: EngineReport) -> bool:
    """A member of a multi-host replica reported (groups.py says the rules): any member's
    failure is the group's; stopped only when every member is; otherwise the leader (rank 0)
    moves the replica. True when it is a failure to diagnose."""
    if report.generation != replica.generation:
        return False
    where = f"member rank {member.rank} on {report.node}"
    if report.phase in (EnginePhase.FAILED, EnginePhase.CRASH_LOOP):
        if replica.state in (ReplicaState.STOPPING, ReplicaState.STOPPED, ReplicaState.FAILED):
            return False
        fields = {"exit_code": report.exit_code}
        if report.log_tail:
            fields["log_tail"] = report.log_tail[-50:]
        if report.log_path:
            fields["log_path"] = report.log_path
        return transition_replica(
            replica,
            ReplicaState.FAILED,
            f"{where}: {strip_controls(report.reason or report.phase)}; the whole group restarts",
            **fields,
        )
    if report.phase == EnginePhase.STOPPED:
        if replica.state == ReplicaState.STOPPING and groups.all_stopped(replica):
            if transition_replica(replica, ReplicaState.STOPPED, "every member stopped"):
                scheduler.release(replica)
                Replica.objects.filter(pk=replica.pk).update(pid=None)
        return False
    if member.rank != 0 or groups.failed_member(replica) is not None:
        return False  # a follower alive, or a leader report after a member failed
    return _apply(replica, report, group=True)


_BUSY_PORT = re.compile(r"port (\d+) is already in use on this host")


def _replace_busy_port(replica: Replica, report: EngineReport, reason: str, fields: dict) -> bool:
    """The agent refused the start because something else listens on the replica's port:
    remember the port as taken on that node and send the replica back to be placed again (on
    another port), with both steps on its journal. True when that was done."""
    m = _BUSY_PORT.search(reason)
    if m is None or replica.node is None or int(m.group(1)) != replica.port:
        return False
    ports.mark_busy(replica.node.name, replica.port)
    if not transition_replica(replica, ReplicaState.FAILED, reason, **fields):
        return False
    moved = transition_replica(
        replica,
        ReplicaState.PENDING,
        f"port {replica.port} is taken on {replica.node.name} by another program: "
        "placing the replica again on a free port",
    )
    if moved:
        scheduler.release(replica)
    return moved


def on_failure(replica: Replica, report: EngineReport) -> None:
    """Hook for diagnosis: runs on every failed start, crash and unhealthy transition."""
    log.info("replica %s %s: %s", replica, report.phase, strip_controls(report.reason or ""))
    open_incident_for_replica(replica, report)  # logs and returns None on any failure


def engine_metrics(replica_ids: list[int]) -> dict[int, dict]:
    """{replica id: {"at": ISO time or None, metric: value}} from the last scrapes. Whatever is
    in Redis, never raises: an unreadable entry is skipped and a value that is not a finite,
    non-negative number left out (logged), so pages and the gateway's routing only see
    numbers."""
    if not replica_ids:
        return {}
    values = get_redis().mget([metrics_key(i) for i in replica_ids])
    found = {}
    for replica_id, raw in zip(replica_ids, values, strict=True):
        if raw:
            doc = _metrics_doc(replica_id, raw)
            if doc is not None:
                found[replica_id] = doc
    return found


def _metrics_doc(replica_id: int, raw: bytes) -> dict | None:
    try:
        doc = json.loads(raw)
    except ValueError:  # also UnicodeDecodeError
        doc = None
    if not isinstance(doc, dict):
        log.warning("ignoring unreadable metrics of replica %s in Redis", replica_id)
        return None
    at = doc.pop("at", None)
    metrics = fit_metrics(doc)
    if len(metrics) != len(doc):
        log.warning("ignoring bad metric values of replica %s in Redis", replica_id)
    return {"at": at if isinstance(at, str) else None, **metrics}


def engine_reports(node: str, raw: bytes) -> list[EngineReport]:
    """The reports kept under `npc:engines:<node>` (console/inventory/heartbeats.py), each
    validated again as that node's. Whatever is in Redis, never raises: an entry that does
    not validate is skipped and logged."""
    try:
        entries = json.loads(raw)
    except ValueError:
        entries = None
    if not isinstance(entries, list):
        log.warning("ignoring unreadable engine reports of %s in Redis", node)
        return []
    reports = []
    for entry in entries[:MAX_ENGINES]:
        if not isinstance(entry, dict):
            log.warning("skipping an engine report of %s in Redis: not an object", node)
            continue
        try:
            reports.append(EngineReport.model_validate({**entry, "node": node}))
        except ValidationError as exc:
            log.warning("skipping an engine report of %s in Redis: %s", node, describe(exc))
    return reports


def now() -> datetime:
    return datetime.now(UTC)
