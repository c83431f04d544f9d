"""A small fleet for the malicious-host tests: victim node A with a replica, attacker node B with
its own valid credential, and a snapshot of everything a message from B could change.

Node names are unique per test: the heartbeat path caches node ids per process and Redis
outlives each test's database, so a reused name would read another test's state.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha256

from console.accounts.models import AuditEntry
from console.deployments.engines import metrics_key
from console.deployments.models import Replica, ReplicaEvent
from console.diagnosis.models import Incident
from console.hot import get_redis
from console.inventory.heartbeats import engines_key
from console.inventory.inbox import REFUSALS_KEY, SEQ_KEY, Inbox
from console.inventory.models import Node, NodeCheckRun
from console.logs.models import LogLine
from console.telemetry.services import latest_key
from tests.kit import make_deployment, make_replica
from tests.node_support import enroll_node, sealed
from workers import channel
from workers.contracts import Tasks

YEAR_2099 = datetime(2099, 6, 1, tzinfo=UTC)
NODE_FIELDS = (
    "name",
    "hostname",
    "address",
    "pending_address",
    "status",
    "admin_state",
    "last_heartbeat",
    "agent_version",
    "cpu_cores",
    "labels",
    "telemetry_ok",
    "log_error",
    "reenroll_allowed",
)
REPLICA_FIELDS = (
    "node_id",
    "port",
    "pid",
    "generation",
    "state",
    "state_reason",
    "state_changed_at",
    "restarts",
    "exit_code",
    "log_path",
    "log_tail",
)


def beat(node: str, *, address: str = "", chips: int = 2, **extra) -> dict:
    """A heartbeat body as the agent builds it (workers/agent.py build_heartbeat)."""
    body = {
        "node": node,
        "sent_at": datetime.now(UTC).isoformat(),
        "seq": 1,
        "agent_version": "0.2.0",
        "interval_s": 5.0,
        "host": {
            "hostname": f"{node}.dc",
            "address": address,
            "arch": "aarch64",
            "cpu_model": "Kunpeng 920",
            "cpu_cores": {"logical": 192, "physical": 192},
            "memory_total_mb": 1_048_576,
        },
        "versions": {"npu_driver": "24.1.rc2", "cann_toolkit": "8.1.RC1"},
        "chips": [
            {
                "npu_id": i,
                "chip_id": 0,
                "name": "910B3",
                "health": "OK",
                "hbm_used_mb": 3000,
                "hbm_total_mb": 65536,
                "temperature_c": 45,
                "bus_id": f"0000:C{i}:00.0",
            }
            for i in range(chips)
        ],
    }
    body.update(extra)
    return body


def engine_report(node: str, replica: Replica, phase: str = "failed", **extra) -> dict:
    body = {
        "node": node,
        "replica_id": replica.pk,
        "generation": replica.generation,
        "phase": phase,
        "reason": "forged: out of memory",
        "exit_code": 137,
        "at": datetime.now(UTC).isoformat(),
    }
    body.update(extra)
    return body


def log_batch(node: str, replica: Replica, lines: list[str] | None = None) -> dict:
    return {
        "node": node,
        "replica_id": replica.pk,
        "generation": replica.generation,
        "run": 1,
        "file": "engine.log",
        "first_line_no": 1,
        "lines": lines or ["ERROR forged: NPU out of memory", "Traceback (most recent call)"],
    }


def check_report(node: str, run_id: int | None, ok: bool = False) -> dict:
    return {
        "node": node,
        "run_id": run_id,
        "trigger": "on-demand",
        "sent_at": datetime.now(UTC).isoformat(),
        "results": [{"name": "npu-smi", "ok": ok, "evidence": "forged", "fix": "forged"}],
    }


def seal_bytes(key: bytes, data: bytes) -> bytes:
    """A message whose JSON text is exactly `data` (for documents json.dumps cannot write)."""
    return hmac.new(key, data, sha256).hexdigest().encode() + b"." + data


def random_identity(node: str, kid: int) -> channel.Identity:
    return channel.Identity(node=node, kid=kid, key_hex=secrets.token_hex(32))


@dataclass
class Fleet:
    a: channel.Identity  # the victim, enrolled the normal way
    b: channel.Identity  # the attacker: a host with its own valid credential
    node_a: Node
    node_b: Node
    replica: Replica  # placed on A
    replica_b: Replica  # placed on B
    run: NodeCheckRun  # a pending check run of A
    inbox: Inbox

    def send(self, *raws: bytes):
        return self.inbox.handle_batch(list(raws))

    def genuine_beat_accepted(self) -> None:
        """The legit agent keeps working: A's next beat is taken and seen."""
        before = get_redis().get(latest_key(self.a.node))
        outcome = self.send(sealed(self.a, Tasks.HEARTBEAT, beat(self.a.node, address="10.1.0.1")))
        assert outcome == {"ok": 1}, outcome
        after = get_redis().get(latest_key(self.a.node))
        assert after and after != before


def make_fleet() -> Fleet:
    """A and B enrolled (their own tokens), both beating once; a deployment with one replica
    on each, a pending check run on A. Call inside a test with the database."""
    suffix = secrets.token_hex(3)
    a, b = enroll_node(f"victim-{suffix}"), enroll_node(f"attacker-{suffix}")
    inbox = Inbox()
    outcome = inbox.handle_batch(
        [
            sealed(a, Tasks.HEARTBEAT, beat(a.node, address="10.1.0.1")),
            sealed(b, Tasks.HEARTBEAT, beat(b.node, address="10.2.0.2")),
        ]
    )
    assert outcome == {"ok": 2}, outcome
    node_a, node_b = Node.objects.get(name=a.node), Node.objects.get(name=b.node)
    assert node_a.status == "online" and node_a.address == "10.1.0.1"
    dep = make_deployment(
        f"dep-{suffix}",
        model_path="/models/m",
        served_model_name="m",
        device="npu",
        desired_state="running",
    )
    replica = make_replica(dep, node=node_a, generation=3, pid=4242)
    replica_b = make_replica(dep, node=node_b, generation=3, pid=4343)
    run = NodeCheckRun.objects.create(node=node_a, requested_by="ada")
    for pk in (replica.pk, replica_b.pk):  # ids come back after a rollback; Redis keeps keys
        get_redis().delete(metrics_key(pk), f"npc:engine-applied:{pk}", f"npc:engine-series:{pk}")
    return Fleet(a, b, node_a, node_b, replica, replica_b, run, inbox)


def snapshot(fleet: Fleet) -> dict:
    """Everything about A (and the shared tables) a message from B could change."""
    r = get_redis()
    a, rid = fleet.a.node, fleet.replica.pk
    return {
        "node": Node.objects.filter(name=a).values(*NODE_FIELDS).get(),
        "chips": sorted(fleet.node_a.accelerators.values_list("npu_id", "chip_id", "health")),
        "creds": sorted(fleet.node_a.credentials.values_list("pk", "revoked_at", "grace_until")),
        "replica": Replica.objects.filter(pk=rid).values(*REPLICA_FIELDS).get(),
        "replica_events": ReplicaEvent.objects.filter(replica_id=rid).count(),
        "incidents": Incident.objects.count(),
        "log_lines": LogLine.objects.count(),
        "runs_of_a": list(
            NodeCheckRun.objects.filter(node__name=a).values_list("pk", "status", "results")
        ),
        # B's own journal may grow (its pending address): nothing else may
        "audit": AuditEntry.objects.exclude(action="node.refused")
        .exclude(object_repr=fleet.b.node)
        .count(),
        "redis": {
            "metrics": r.get(metrics_key(rid)),
            "applied": r.get(f"npc:engine-applied:{rid}"),
            "engines": r.get(engines_key(a)),
            "latest": r.get(latest_key(a)),
            "state": r.hgetall(f"npc:node:{a}"),
            "seq": r.hget(SEQ_KEY, a),
            "commands": r.lrange(channel.cmd_key(a), 0, -1),
        },
    }


def refusal_counts() -> dict[str, int]:
    return {k.decode(): int(v) for k, v in get_redis().hgetall(REFUSALS_KEY).items()}


def refused_since(before: dict[str, int]) -> dict[str, int]:
    """Refusals counted in Redis since `before` (other tests may share the Redis: >= checks)."""
    now = refusal_counts()
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


def refusal_audits(node: str | None = None) -> list[str]:
    entries = AuditEntry.objects.filter(action="node.refused")
    if node is not None:
        entries = entries.filter(object_repr__contains=node)
    return list(entries.values_list("message", flat=True))
