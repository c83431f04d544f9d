"""Heartbeat ingest and offline detection.

Cost does not grow with every beat: the node's state is cached in a Redis hash
(`npc:node:<name>`), the last-seen time goes to a sorted set (`npc:seen`), telemetry to the
hot store; the database is written only when something changed — registration, host or
version facts, the chip inventory or health, the status — and `last_heartbeat` at most once
per DB_BEAT_EVERY_S.
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import datetime, timedelta

import orjson
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import TypeAdapter, ValidationError

from console.accounts.services import Actor
from console.diagnosis.incidents import chips_reported
from console.hot import get_redis
from console.inventory.live import HOT_C
from console.inventory.models import Accelerator, Health, Node, NodeStatus
from console.inventory.ports import record_listening
from console.inventory.services import (
    address_allowed,
    report_node_address,
    status_for,
    transition_node,
)
from console.telemetry.services import buffer_samples, put_summaries, record_heartbeat
from workers.contracts import EngineReport, Heartbeat, describe

log = logging.getLogger(__name__)
SEEN_KEY = "npc:seen"
STATE_FIELDS = ("id", "status", "static", "chips", "db_at", "hot", "ports")
_node_ids: dict[str, int] = {}  # node name -> id, per process (ids never change)
DB_BEAT_EVERY_S = 60.0
STATE_TTL_S = 3600  # a node's cached state outlives a silence of an hour
_ENGINE_LIST = TypeAdapter(list[EngineReport])


class HeartbeatRejected(Exception):
    pass


def _node_key(name: str) -> str:
    return f"npc:node:{name}"


def _digest(value) -> str:
    return hashlib.blake2b(
        orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str), digest_size=12
    ).hexdigest()


def _static_fields(hb: Heartbeat) -> dict:
    """The node's host and version facts as stored. The contract caps every value at the
    length of the column it fills (workers/contracts.py HostInfo), so nothing is cut here.
    `address` is part of the digest but applied on its own (services.report_node_address)."""
    host, versions = hb.host, hb.versions
    return {
        "hostname": host.hostname or hb.node,
        "address": host.address,
        "arch": host.arch or "",
        "cpu_model": host.cpu_model or "",
        "cpu_cores": host.cpu_cores.logical,
        "memory_mb": host.memory_total_mb,
        "os": host.os or "",
        "kernel": host.kernel or "",
        "npu_driver_version": versions.get("npu_driver") or "",
        "npu_firmware_version": versions.get("npu_firmware") or "",
        "cann_version": versions.get("cann_toolkit") or "",
        "npu_smi_version": versions.get("npu_smi") or "",
        "agent_version": hb.agent_version,
        "software": {k: versions.get(k) for k in ("vllm", "vllm_ascend", "torch", "torch_npu")},
        "simulated": hb.simulated,
        "telemetry_ok": hb.telemetry_ok,
        "telemetry_reason": hb.telemetry_reason or "",
        "log_error": hb.log_error or "",
        "numa_nodes": numa_layout(host.numa_cpulists, host.numa_memory_mb),
        "interfaces": dict(getattr(host, "interfaces", None) or {}),
    }


def numa_layout(cpulists: dict[str, str], memory_mb: dict[str, int]) -> list[dict]:
    """The host's NUMA layout as Node.numa_nodes stores it, by node id: what the agent read
    under /sys/devices/system/node (keys "node<N>"; any other key is left out)."""
    nodes = []
    for key, cpus in cpulists.items():
        if key.startswith("node") and key[4:].isdigit():
            nodes.append({"node": int(key[4:]), "cpus": cpus, "memory_mb": memory_mb.get(key)})
    return sorted(nodes, key=lambda n: n["node"])


def check_address(hb: Heartbeat) -> None:
    """Raise HeartbeatRejected when the beat reports an address outside NODE_ADDRESS_CIDRS.
    (Anything that is not an IP address was already refused by the contract.) No I/O."""
    if not address_allowed(hb.host.address):
        raise HeartbeatRejected(
            f"node {hb.node} reported address {hb.host.address}, outside NODE_ADDRESS_CIDRS"
        )


def _chip_inventory(hb: Heartbeat) -> list[dict]:
    return [
        {
            "npu_id": c.npu_id,
            "chip_id": c.chip_id,
            "logic_id": c.logic_id,
            "phy_id": c.phy_id,
            "vendor": c.vendor,
            "model_name": c.name or "",
            "health": _health(c.health),
            "hbm_total_mb": c.hbm_total_mb,
            "memory_total_mb": c.memory_total_mb,
            "bus_id": c.bus_id or "",
            "numa_node": c.numa_node,
        }
        for c in hb.chips
    ]


_HEALTH = {h.value.lower(): h.value for h in Health}


def _health(value: str | None) -> str:
    return _HEALTH.get(value.strip().lower(), Health.UNKNOWN) if value else Health.UNKNOWN


def ingest_heartbeat(
    payload: dict,
    *,
    node: str,
    received_at: datetime | None = None,
    owned_replicas: set[int] | None = None,
) -> int | None:
    """Apply one heartbeat of `node`, the identity its signature proved (console/inventory/
    inbox.py): the payload's own `node` must be the same. Returns the node id, or None when the
    beat was refused (logged); raises HeartbeatRejected for a beat naming another node, an
    unregistered node or a refused address. `owned_replicas`: the replicas placed on the
    node; engine metrics of any other replica are not recorded (NodeRestriction)."""
    (result,) = ingest_heartbeats(
        [(node, payload, owned_replicas)], received_at=received_at or timezone.now()
    )
    if isinstance(result, Exception):
        raise result
    return result


def ingest_heartbeats(
    beats: list[tuple[str, dict, set[int] | None]], *, received_at: datetime
) -> list[int | None | Exception]:
    """Apply a batch of authenticated beats, (node, payload, owned replicas) each, with one
    Redis round trip for all of them in steady state (two when something changed). Returns,
    per beat, the node id, None (invalid payload, logged) or the HeartbeatRejected / error it
    met; one beat's failure never stops the others."""
    out: list[int | None | Exception] = [None] * len(beats)
    parsed: list[tuple[int, Heartbeat, set[int] | None]] = []
    for i, (node, payload, owned) in enumerate(beats):
        try:
            hb = Heartbeat.model_validate(payload)
        except ValidationError as exc:
            log.warning("heartbeat from %s refused: invalid payload: %s", node, describe(exc))
            continue
        try:
            if hb.node != node:
                raise HeartbeatRejected(f"node {node} sent a heartbeat as {hb.node}")
            check_address(hb)  # outside NODE_ADDRESS_CIDRS: refused before anything is stored
        except HeartbeatRejected as exc:
            out[i] = exc
            continue
        parsed.append((i, hb, owned))
    _known_ids([hb.node for _, hb, _ in parsed if hb.node not in _node_ids])
    r = get_redis()
    pipe = r.pipeline(transaction=False)
    at: list[int] = []  # where each beat's HMGET answer is in the pipeline's results
    seen: dict[str, float] = {}
    samples: list[bytes] = []
    summaries: list[str | bytes] = []
    for i, hb, owned in parsed:
        node_id = _node_ids.get(hb.node)
        if node_id is None:
            out[i] = HeartbeatRejected(f"node {hb.node} is not registered (deleted?): enroll again")
            at.append(-1)
            continue
        at.append(len(pipe))
        pipe.hmget(_node_key(hb.node), STATE_FIELDS)
        seen[hb.node] = received_at.timestamp()
        record_heartbeat(
            node_id=node_id,
            node_name=hb.node,
            received_at=received_at,
            hb=hb,
            pipe=pipe,
            samples=samples,
            summaries=summaries,
        )
        if hb.engines:
            record_engines(pipe, hb.node, hb.engines, owned)
    if seen:  # one ZADD, one RPUSH and one fleet-summary script call for the whole batch
        pipe.zadd(SEEN_KEY, seen)
    buffer_samples(pipe, samples)
    put_summaries(pipe, summaries)
    values = pipe.execute() if len(pipe) else []
    updates = r.pipeline(transaction=False)
    beat_due: list[int] = []  # nodes whose last_heartbeat is due: one UPDATE for the batch
    for (i, hb, _), pos in zip(parsed, at, strict=True):
        if pos < 0:
            continue
        try:
            out[i] = _settle(hb, values[pos], received_at, updates, beat_due)
        except Exception as exc:  # noqa: BLE001 - one node's database trouble, not the batch's
            log.exception("heartbeat from %s failed", hb.node)
            out[i] = exc
    if beat_due:  # every beat of a batch has the same time (a write lock taken once, not 500x)
        Node.objects.filter(pk__in=beat_due).update(last_heartbeat=received_at)
    if len(updates):  # a second round trip only when something changed
        updates.execute()
    return out


def _known_ids(names: list[str]) -> None:
    """Fill the per-process name -> id cache for `names` in one query."""
    if names:
        _node_ids.update(Node.objects.filter(name__in=names).values_list("name", "pk"))


def _settle(
    hb: Heartbeat, values: list, received_at: datetime, updates, beat_due: list[int]
) -> int:
    """Compare one beat with the node's cached state; write to the database only what
    changed and queue the new cached values on `updates`."""
    node_id = _node_ids[hb.node]
    cached = {f: v.decode() for f, v in zip(STATE_FIELDS, values, strict=True) if v is not None}
    if cached.get("id") != str(node_id):  # state evicted (Redis restart) or node re-created
        _node_ids.pop(hb.node, None)
        loaded = _load(hb.node)
        if loaded is None:
            raise HeartbeatRejected(f"node {hb.node} is not registered (deleted?): enroll again")
        node_id = int(loaded["id"])
        _node_ids[hb.node] = node_id
        changes = {**loaded, **_apply_changes(hb, loaded, node_id, received_at, beat_due)}
    else:
        changes = _apply_changes(hb, cached, node_id, received_at, beat_due)
    if changes:  # at least once a minute (db_at): the state's TTL is renewed with it
        updates.hset(_node_key(hb.node), mapping=changes)
        updates.expire(_node_key(hb.node), STATE_TTL_S)
    return node_id


def engines_key(node: str) -> str:
    return f"npc:engines:{node}"


def record_engines(
    pipe, node: str, engines: list[EngineReport], owned: set[int] | None = None
) -> None:
    """The agent's view of its engines (validated reports, stored as JSON): kept hot for the
    reconcile loop (which repairs any missed report) and each engine's scraped metrics for the
    pages. Metrics are recorded only for the replicas in `owned` (placed on this node) when
    given: they steer routing."""
    from console.deployments.engines import METRICS_TTL_S, metrics_key, record_point

    pipe.set(engines_key(node), _ENGINE_LIST.dump_json(engines), ex=METRICS_TTL_S)
    for e in engines:
        if owned is not None and e.replica_id not in owned:
            continue
        if e.metrics:
            point = json.dumps({"at": e.at.isoformat(), **e.metrics})
            pipe.set(metrics_key(e.replica_id), point, ex=METRICS_TTL_S)
            record_point(pipe, e.replica_id, point)  # the charts' and the autoscaler's hour


def _load(name: str) -> dict | None:
    """The node's cached-state seed from the database (None: not registered). Nodes are
    registered by enrollment (console/inventory/identity.py), never by a heartbeat."""
    row = Node.objects.filter(name=name).values_list("pk", "status").first()
    if row is None:
        return None
    return {"id": str(row[0]), "status": row[1], "static": "", "chips": "", "db_at": "0"}


def _apply_changes(
    hb: Heartbeat, cached: dict, node_id: int, now: datetime, beat_due: list[int] | None = None
) -> dict:
    """Write to the database only what changed; return the new cached values. A node whose
    only write is its `last_heartbeat` (at most once a minute) goes on `beat_due` when given,
    for the caller to write for a whole batch at once."""
    updates: dict[str, str] = {}
    node_fields: dict = {}
    static = _static_fields(hb)
    static_digest = _digest(static)
    if cached.get("static") != static_digest:
        # An address change waits for an admin (once per distinct address: the digest of the
        # reported facts is cached, so an unchanged pending address costs nothing per beat).
        report_node_address(node_id=node_id, name=hb.node, address=static.pop("address"))
        node_fields.update(static)
        updates["static"] = static_digest
    chips = _chip_inventory(hb)
    chips_digest = _digest(chips)
    if cached.get("chips") != chips_digest:
        sync_accelerators(node_id, chips, now)
        updates["chips"] = chips_digest
    if now.timestamp() - float(cached.get("db_at") or 0) > DB_BEAT_EVERY_S or node_fields:
        updates["db_at"] = str(now.timestamp())
        if node_fields or beat_due is None:
            node_fields["last_heartbeat"] = now
        else:
            beat_due.append(node_id)
    if node_fields:
        Node.objects.filter(pk=node_id).update(**node_fields)
    ports = hb.host.listening_ports
    ports_digest = _digest(ports) if ports else ""
    if cached.get("ports", "") != ports_digest:  # the host's listening ports changed
        record_listening(hb.node, ports)
        updates["ports"] = ports_digest
    hot = sorted(f"{c.npu_id}.{c.chip_id}" for c in hb.chips if (c.temperature_c or 0) >= HOT_C)
    if cached.get("hot", "") != ",".join(hot):
        _newly_hot(node_id, hb, set(hot) - set(filter(None, cached.get("hot", "").split(","))))
        updates["hot"] = ",".join(hot)
    if cached.get("status") == NodeStatus.OFFLINE:
        updates["status"] = _bring_online(node_id, now)
    return updates


def _newly_hot(node_id: int, hb: Heartbeat, keys: set[str]) -> None:
    """Chips that just crossed HOT_C open (or fold into) an over-temperature incident.
    Checked only when the set of hot chips changes, so a chip that stays hot costs nothing."""
    from console.diagnosis.incidents import open_incident_for_chip

    for chip in hb.chips:
        if f"{chip.npu_id}.{chip.chip_id}" in keys:
            open_incident_for_chip(
                Node(pk=node_id, name=hb.node), chip.model_dump(), kinds=["over-temperature"]
            )


def _bring_online(node_id: int, now: datetime) -> str:
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node_id)
        if node.status == NodeStatus.OFFLINE:
            to = status_for(node.admin_state, reachable=True)
            transition_node(
                node=node, to=to, reason="heartbeat received again", actor=Actor.system("heartbeat")
            )
            Node.objects.filter(pk=node_id).update(last_heartbeat=now)
        return node.status


def sync_accelerators(node_id: int, chips: list[dict], now: datetime) -> None:
    """Upsert the node's chips as reported, writing only rows that differ (after a Redis
    restart every node's first beat lands here: the rows already match, nothing is written);
    chips no longer reported get health UNKNOWN."""
    chips_reported(node_id, chips)  # incidents for chips turned sick/hot; never raises
    existing = {(a.npu_id, a.chip_id): a for a in Accelerator.objects.filter(node_id=node_id)}
    new, changed, names = [], [], set()
    for chip in chips:
        key = (chip["npu_id"], chip["chip_id"])
        fields = {k: v for k, v in chip.items() if k not in {"npu_id", "chip_id"}}
        fields["bus_id"] = fields["bus_id"][:32]
        fields["model_name"] = fields["model_name"][:64]
        row = existing.pop(key, None)
        if row is None:
            new.append(
                Accelerator(node_id=node_id, npu_id=key[0], chip_id=key[1], last_seen=now, **fields)
            )
            continue
        differ = {k for k, v in fields.items() if getattr(row, k) != v}
        if differ:
            for k in differ:
                setattr(row, k, fields[k])
            row.last_seen = now
            changed.append(row)
            names |= differ
    with transaction.atomic():
        if new:
            Accelerator.objects.bulk_create(new)
        if changed:
            Accelerator.objects.bulk_update(changed, [*sorted(names), "last_seen"])
        if existing:
            Accelerator.objects.filter(pk__in=[a.pk for a in existing.values()]).update(
                health=Health.UNKNOWN
            )


def mark_offline(now: datetime | None = None) -> list[str]:
    """Mark offline every reachable node silent for OFFLINE_AFTER_MISSED_BEATS intervals.

    Returns the names marked. Engines' records are not touched here; the node going offline
    never stops or deletes them.
    """
    now = now or timezone.now()
    window = settings.HEARTBEAT_INTERVAL_S * settings.OFFLINE_AFTER_MISSED_BEATS
    cutoff = now - timedelta(seconds=window)
    candidates = list(
        Node.objects.exclude(status=NodeStatus.OFFLINE).values_list("name", "last_heartbeat")
    )
    if not candidates:
        return []
    r = get_redis()
    scores = r.zmscore(SEEN_KEY, [name for name, _ in candidates])
    marked = []
    for (name, db_beat), score in zip(candidates, scores, strict=True):
        last = datetime.fromtimestamp(score, tz=now.tzinfo) if score else db_beat
        if last is not None and last >= cutoff:
            continue
        silent = f"{(now - last).total_seconds():.0f}s" if last else "ever"
        with transaction.atomic():
            node = Node.objects.select_for_update().get(name=name)
            reason = f"no heartbeat for {silent} ({settings.OFFLINE_AFTER_MISSED_BEATS} intervals missed)"
            if node.status != NodeStatus.OFFLINE and transition_node(
                node=node,
                to=NodeStatus.OFFLINE,
                reason=reason,
                actor=Actor.system("heartbeat-monitor"),
            ):
                Node.objects.filter(pk=node.pk).update(last_heartbeat=last)
                marked.append(name)
        r.hset(_node_key(name), "status", NodeStatus.OFFLINE)
    return marked


def forget_node(name: str) -> None:
    """Drop a node's cached heartbeat state (called when the node is deleted)."""
    _node_ids.pop(name, None)
    try:
        r = get_redis()
        r.delete(_node_key(name))
        r.zrem(SEEN_KEY, name)
    except Exception:  # noqa: BLE001 - Redis down: the cached id check re-syncs on the next beat
        log.warning("could not drop the cached state of deleted node %s", name)
