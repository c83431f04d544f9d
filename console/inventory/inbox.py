"""The console's end of the inbound channel: `npc:inbox`, read in batches by one consumer.

Every message is authenticated before anything is read from it but its header: the node's
identity comes from the key that signed it (console/inventory/identity.py), never from the
payload. Then NodeRestriction: a node writes only its own node record, its own NPUs, the
replicas placed on it and the answers to model inspections and network probes asked of
it. Every refusal is counted (`npc_node_refusals_total{reason}` on /metrics) and leaves an
audit entry, at most one a minute per node and reason.

One consumer at a time (a Redis lease): list order is seq order per node, so a replay check is
one comparison. A batch is moved atomically to `npc:inbox:processing` and deleted only after
it is handled: a console killed mid-batch handles it again on restart, and the seq check makes
that idempotent.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

import orjson
from django.db import close_old_connections, connection
from pydantic import ValidationError

from console.accounts.services import Actor, record
from console.hot import get_redis
from console.inventory.identity import (
    CRED_VERSION_KEY,
    CredentialCache,
    handle_enrollment,
    sync_acl,
)
from console.inventory.models import Node, NodeCredential
from workers import channel
from workers.contracts import (
    CheckReport,
    EngineReport,
    InspectionReport,
    NetProbeReport,
    Tasks,
    describe,
)

log = logging.getLogger(__name__)
PROCESSING_KEY = "npc:inbox:processing"
SEQ_KEY = "npc:inbox:seq"
LEADER_KEY = "npc:inbox:leader"
REFUSALS_KEY = "npc:refusals"
LEASE_MS = 15_000
BATCH = 500
# per node and kind: an agent beats every few seconds, ships a log batch (<= 1,000 lines)
# every 0.5 s per engine; a flood beyond this is refused (counted), not queued for the database
RATE_PER_S, BURST = 100.0, 1000.0
USED_EVERY_S = 60.0
PLACEMENT_TTL_S = 5.0
ACL_SYNC_S = 60.0

# Move up to ARGV[1] items from the inbox to the processing list, atomically.
_POP = """
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items > 0 then
  redis.call('LTRIM', KEYS[1], #items, -1)
  redis.call('RPUSH', KEYS[2], unpack(items))
end
return items
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class Inbox:
    """Handles batches of sealed messages. `handle_batch` is the whole per-message path."""

    def __init__(self, r=None) -> None:
        self.r = r or get_redis()
        self.creds = CredentialCache()
        self.last_seq: dict[str, int] = {}
        self.buckets: dict[str, tuple[float, float]] = {}
        self.used_written: dict[int, float] = {}  # credential id -> when last_used_at was set
        self.used_due: dict[int, float] = {}
        self.batch_now = 0.0
        self.refusals: Counter[str] = Counter()
        self._seq_loaded = False
        self._placed: dict[str, set[int]] = {}
        self._placed_at = -1e9

    def placed(self, node: str) -> set[int]:
        """Replica ids placed on `node` (reloaded every few seconds: one query for all)."""
        from console.deployments.models import Replica

        if time.monotonic() - self._placed_at > PLACEMENT_TTL_S:
            placed: dict[str, set[int]] = {}
            for pk, name in Replica.objects.exclude(node=None).values_list("pk", "node__name"):
                placed.setdefault(name, set()).add(pk)
            self._placed, self._placed_at = placed, time.monotonic()
        return self._placed.get(node, set())

    # -- authentication ------------------------------------------------------------------------
    def authenticate(self, raw: bytes, now: float) -> tuple[str, int, str, object]:
        """(node, kid, kind, body) of an authentic, fresh, first-seen message; else Refused."""
        mac, data, doc = channel.unseal_unverified(raw, loads=orjson.loads)
        node, kid, kind, seq = doc.get("n"), doc.get("kid"), doc.get("k"), doc.get("s")
        if not isinstance(node, str) or not isinstance(kid, int) or not isinstance(seq, int):
            raise channel.Refused("no node, credential or sequence", "malformed")
        cred = self.creds.get(node, kid)
        if cred is None:
            raise channel.Refused(f"no active credential #{kid} for node {node[:63]!r}", "identity")
        if not channel.verify(cred.key, mac, data):
            raise channel.Refused(f"bad signature for node {node!r}", "signature")
        channel.check_time(doc.get("t"), now)
        if seq <= self.last_seq.get(node, 0):
            raise channel.Refused(f"sequence {seq} already seen (replay)", "replay")
        self.last_seq[node] = seq
        if kind not in HANDLERS:
            raise channel.Refused(f"unknown kind {str(kind)[:60]!r}", "kind")
        if not self._take(f"{node}\x00{kind}", now):  # a log flood never starves the beats
            raise channel.Refused(f"over the node's {kind} rate", "rate")
        if now - self.used_written.get(kid, 0.0) > USED_EVERY_S:
            self.used_due[kid] = self.batch_now
        return node, kid, kind, doc.get("b")

    def _take(self, bucket: str, now: float) -> bool:
        tokens, at = self.buckets.get(bucket, (BURST, now))
        tokens = min(BURST, tokens + (now - at) * RATE_PER_S)
        if tokens < 1:
            self.buckets[bucket] = (tokens, now)
            return False
        self.buckets[bucket] = (tokens - 1, now)
        return True

    # -- a batch -------------------------------------------------------------------------------
    def handle_batch(self, raws: list[bytes], now: float | None = None) -> Counter[str]:
        """Authenticate and apply each message; one bad message never stops the others.
        Returns counts by outcome ("ok", or the refusal code)."""
        now = time.time() if now is None else now
        self.batch_now = now
        self._load_seq()
        outcome: Counter[str] = Counter()
        beats: list[tuple[str, dict]] = []
        seen_before = dict(self.last_seq)
        for raw in raws:
            try:
                node, kid, kind, body = self.authenticate(raw, now)
                if not isinstance(body, dict):
                    raise channel.Refused("body is not an object", "malformed")
                if body.get("node", node) != node:
                    raise channel.Refused(
                        f"node {node} sent a {kind} as node {str(body.get('node'))[:63]!r}",
                        "impersonation",
                    )
                body["node"] = node
                if kind == Tasks.HEARTBEAT:
                    beats.append((node, body))
                else:
                    HANDLERS[kind](self, node, kid, body, now)
                outcome["ok"] += 1
            except channel.Refused as exc:
                outcome[exc.code] += 1
                self.refuse(exc, raw)
            except ValidationError as exc:
                outcome["invalid"] += 1
                self.refuse(channel.Refused(describe(exc), "invalid"), raw)
            except Exception:  # noqa: BLE001 - a handler bug must not stop the inbox
                outcome["error"] += 1
                log.exception("inbound message failed")
        outcome.update(self._heartbeats(beats, now))
        self._save(seen_before, now)
        return outcome

    def _heartbeats(self, beats: list[tuple[str, dict]], now: float) -> Counter[str]:
        from console.inventory.heartbeats import HeartbeatRejected, ingest_heartbeats

        counts: Counter[str] = Counter()
        if not beats:
            return counts
        batch = [(n, body, self.placed(n) if body.get("engines") else None) for n, body in beats]
        results = ingest_heartbeats(batch, received_at=datetime.fromtimestamp(now, UTC))
        for (node, _), result in zip(beats, results, strict=True):
            if isinstance(result, int):
                continue
            counts["ok"] -= 1
            if isinstance(result, HeartbeatRejected):
                counts["invalid"] += 1
                self.refuse(channel.Refused(str(result), "invalid"), b"", node=node)
            elif result is None:  # the payload failed its contract (logged with the field)
                counts["invalid"] += 1
                self.refuse(channel.Refused("heartbeat payload invalid", "invalid"), b"", node=node)
            else:
                counts["error"] += 1
        return counts

    def _load_seq(self) -> None:
        if self._seq_loaded:
            return
        stored = self.r.hgetall(SEQ_KEY)
        for node, seq in stored.items():
            name = node.decode()
            self.last_seq[name] = max(self.last_seq.get(name, 0), int(seq))
        self._seq_loaded = True

    def _save(self, before: dict[str, int], now: float) -> None:
        changed = {n: s for n, s in self.last_seq.items() if before.get(n) != s}
        pipe = self.r.pipeline(transaction=False)
        if changed:
            pipe.hset(SEQ_KEY, mapping=changed)
        for code, n in self.refusals.items():
            pipe.hincrby(REFUSALS_KEY, code, n)
        self.refusals.clear()
        pipe.execute()
        if self.used_due:
            from console.inventory.identity import mark_used

            mark_used({k: datetime.fromtimestamp(t, UTC) for k, t in self.used_due.items()})
            self.used_written.update(self.used_due)
            self.used_due.clear()

    # -- refusals ------------------------------------------------------------------------------
    def refuse(self, exc: channel.Refused, raw: bytes, node: str | None = None) -> None:
        """Count the refusal; audit it at most once a minute per (node, reason)."""
        self.refusals[exc.code] += 1
        claimed = node or _claimed_node(raw)
        log.warning("inbound message refused (%s): %s", exc.code, exc)
        authenticated = exc.code not in {"malformed", "too-large", "identity", "signature"}
        who = claimed if authenticated and claimed else "-"
        if not self.r.set(f"npc:refusal-audit:{who}:{exc.code}", 1, nx=True, ex=60):
            return
        obj = Node.objects.filter(name=who).first() if who != "-" else None
        record(
            actor=Actor.system(f"node {who}" if obj else "inbox"),
            action="node.refused",
            obj=obj,
            message=f"{exc.code}: {exc}"[:500],
        )


def _claimed_node(raw: bytes) -> str | None:
    try:
        return str(orjson.loads(raw.partition(b".")[2]).get("n"))[:63]
    except Exception:  # noqa: BLE001 - junk: no claim
        return None


# --- handlers (NodeRestriction) -----------------------------------------------------------------
def _replica_nodes(replica_id: object) -> set[str]:
    """The nodes a replica is placed on: its node, and every member's for a replica over
    several hosts (console/deployments/groups.py)."""
    from console.deployments.models import Replica, ReplicaMember

    if not isinstance(replica_id, int):
        return set()
    nodes = set(Replica.objects.filter(pk=replica_id).values_list("node__name", flat=True))
    nodes |= set(
        ReplicaMember.objects.filter(replica_id=replica_id).values_list("node__name", flat=True)
    )
    return nodes - {None}


def _own_replica(inbox: Inbox, node: str, body: dict, what: str) -> bool:
    owners = _replica_nodes(body.get("replica_id"))
    if node in owners:
        return True
    owner = ", ".join(sorted(owners))
    inbox.refuse(
        channel.Refused(
            f"node {node} tried to write replica {body.get('replica_id')} ({what}), "
            f"placed on {owner or 'no node'}",
            "not-yours",
        ),
        b"",
        node=node,
    )
    return False


def _engine_report(inbox: Inbox, node: str, kid: int, body: dict, now: float) -> None:
    from console.deployments.engines import apply_report

    report = EngineReport.model_validate(body)  # refused and counted ("invalid") first
    # the report's own time orders reports of a replica: one dated ahead would freeze it
    channel.check_time(report.at.timestamp(), now)
    _own_replica(inbox, node, body, "engine report")
    apply_report(body, node=node)  # not placed here: only asks this node to stop it


def _log_lines(inbox: Inbox, node: str, kid: int, body: dict, now: float) -> None:
    from console.logs.services import ingest_batch

    if _own_replica(inbox, node, body, "log lines"):
        ingest_batch(payload=body)


def _check_results(inbox: Inbox, node: str, kid: int, body: dict, now: float) -> None:
    from console.inventory.checks import store_results

    CheckReport.model_validate(body)  # refused and counted ("invalid"), not dropped silently
    store_results(body, received_at=datetime.fromtimestamp(now, UTC))


def _model_inspection(inbox: Inbox, node: str, kid: int, body: dict, now: float) -> None:
    """An answer to a model inspection: stored only on an inspection asked of this node."""
    from console.deployments.inspection import store_answer

    report = InspectionReport.model_validate(body)  # refused and counted ("invalid") first
    if not store_answer(report, node=node, answered_at=datetime.fromtimestamp(now, UTC)):
        inbox.refuse(
            channel.Refused(
                f"node {node} answered model inspection {report.inspection_id}, "
                "which was not asked of it for that path",
                "not-yours",
            ),
            b"",
            node=node,
        )


def _net_probe(inbox: Inbox, node: str, kid: int, body: dict, now: float) -> None:
    """An answer to a network probe: stored only on a probe asked of this node."""
    from console.deployments.netprobe import store_answer

    report = NetProbeReport.model_validate(body)  # refused and counted ("invalid") first
    if not store_answer(report, node=node, answered_at=datetime.fromtimestamp(now, UTC)):
        inbox.refuse(
            channel.Refused(
                f"node {node} answered network probe {report.probe_id}, which was not asked of it",
                "not-yours",
            ),
            b"",
            node=node,
        )


def _rotated(inbox: Inbox, node: str, kid: int, body: dict, now: float) -> None:
    """The agent signs with its new credential: the superseded ones end now."""
    from console.inventory.identity import bump_version

    older = NodeCredential.objects.filter(node__name=node, revoked_at__isnull=True, pk__lt=kid)
    if older.update(revoked_at=datetime.fromtimestamp(now, UTC), revoked_reason="rotated"):
        bump_version()


HANDLERS: dict[str, Callable] = {
    Tasks.HEARTBEAT: None,  # batched: Inbox._heartbeats
    Tasks.ENGINE_REPORT: _engine_report,
    Tasks.LOG_LINES: _log_lines,
    Tasks.CHECK_RESULTS: _check_results,
    Tasks.MODEL_INSPECTION: _model_inspection,
    Tasks.NET_PROBE: _net_probe,
    "console.credential_rotated": _rotated,
}


# --- the consumer loop ----------------------------------------------------------------------------
class Consumer:
    """Runs the inbox (and enrollment requests) while holding the lease; idles otherwise."""

    def __init__(self, r=None, batch: int = BATCH) -> None:
        self.r = r or get_redis()
        self.inbox = Inbox(self.r)
        self.batch = batch
        self.token = secrets.token_hex(8)
        self._pop = self.r.register_script(_POP)
        self._renew = self.r.register_script(_RENEW)
        self.leader = False
        self._acl_version: bytes | None = b"never"
        self._acl_at = -1e9

    def hold_lease(self) -> bool:
        if self.leader and self._renew(keys=[LEADER_KEY], args=[self.token, LEASE_MS]):
            return True
        self.leader = bool(self.r.set(LEADER_KEY, self.token, nx=True, px=LEASE_MS))
        if self.leader:
            # Another leader may have handled messages since this one last led: reload the
            # seen sequence numbers, or a replay of those would be accepted again.
            self.inbox._seq_loaded = False
            self._handle(self.r.lrange(PROCESSING_KEY, 0, -1))  # a batch left half-done
        return self.leader

    def sync_acl(self) -> None:
        """Redis users follow the credentials: when they change (within a second: a revoked
        node's connections are cut) and every minute (Redis forgets users on restart)."""
        version = self.r.get(CRED_VERSION_KEY)
        if version == self._acl_version and time.monotonic() - self._acl_at < ACL_SYNC_S:
            return
        sync_acl()
        self._acl_version, self._acl_at = version, time.monotonic()

    def step(self, block_s: float = 1.0) -> int:
        """Handle what is waiting (up to one batch, plus enrollment requests). Returns the
        number of inbound messages handled."""
        self.sync_acl()
        for raw in self.r.lpop(channel.ENROLL_KEY, 20) or []:
            handle_enrollment(raw)
        items = self._pop(keys=[channel.INBOX_KEY, PROCESSING_KEY], args=[self.batch])
        if not items:
            got = self.r.blmove(channel.INBOX_KEY, PROCESSING_KEY, block_s, "LEFT", "RIGHT")
            if got is None:
                return 0
            items = [
                got,
                *self._pop(keys=[channel.INBOX_KEY, PROCESSING_KEY], args=[self.batch - 1]),
            ]
        self._handle(items)
        return len(items)

    def _handle(self, items: list[bytes]) -> None:
        if items:
            if not connection.in_atomic_block:  # a long-lived thread: drop stale connections
                close_old_connections()
            self.inbox.handle_batch(items)
        self.r.delete(PROCESSING_KEY)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                if not self.hold_lease():
                    stop.wait(1.0)
                    continue
                self.step()
            except Exception:  # noqa: BLE001 - Redis or database away: retry, never die
                log.exception("inbox consumer: retrying in 1 s")
                stop.wait(1.0)
        if self.leader:
            self.r.delete(LEADER_KEY)


def start_thread(stop: threading.Event) -> threading.Thread:
    """The consumer in a daemon thread (started by each console worker; one holds the lease)."""
    thread = threading.Thread(target=Consumer().run, args=(stop,), name="inbox", daemon=True)
    thread.start()
    return thread


def refuse_legacy(task: str) -> None:
    """A message on the old Celery path (agents before 0.2, unsigned): counted, logged at most
    once a minute, never applied. docs/operations.md, "Upgrading agents to node identity"."""
    r = get_redis()
    r.hincrby(REFUSALS_KEY, "old-protocol", 1)
    if r.set("npc:refusal-audit:-:old-protocol", 1, nx=True, ex=60):
        log.warning(
            "%s refused: an agent speaks the old, unsigned protocol; upgrade it "
            "(docs/operations.md, Upgrading agents to node identity)",
            task,
        )


def refusal_counts() -> dict[str, int]:
    return {k.decode(): int(v) for k, v in get_redis().hgetall(REFUSALS_KEY).items()}
