"""Promise: a host speaks only for itself (issue 12). A malicious host with Redis access and a
valid credential of its own (node B) cannot change anything of another node (A) through the
console's inbox: impersonation with another node's or no credential, replays, messages dated
in the future or far past, junk and huge payloads, writes to A's replicas, log lines, engine
metrics and check runs. Each is refused with nothing of A changed, counted in `npc:refusals`,
audited at most once a minute per (node, reason), and A's own agent keeps working.

In-process: the messages go through `Inbox.handle_batch`, the whole per-message path the
consumer runs (console/inventory/inbox.py). The same attacks through real processes are in
test_malicious_host_e2e.py.
"""

from __future__ import annotations

import json
import secrets
import time

import pytest
from django.utils import timezone

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.deployments.engines import metrics_key
from console.deployments.models import Replica
from console.deployments.reconcile import repair_from_heartbeats
from console.diagnosis.models import Incident
from console.hot import get_redis
from console.inventory.identity import revoke_credential
from console.inventory.inbox import LEADER_KEY, Consumer, Inbox
from console.inventory.models import Node, NodeCheckRun
from console.logs.models import LogLine
from tests.node_support import sealed
from tests.security.hostile_hosts import (
    YEAR_2099,
    beat,
    check_report,
    engine_report,
    log_batch,
    make_fleet,
    random_identity,
    refusal_audits,
    refusal_counts,
    refused_since,
    seal_bytes,
    snapshot,
)
from workers import channel
from workers.contracts import Tasks

pytestmark = [pytest.mark.security, pytest.mark.django_db]

HB, REPORT, LOGS, CHECKS = (
    Tasks.HEARTBEAT,
    Tasks.ENGINE_REPORT,
    Tasks.LOG_LINES,
    Tasks.CHECK_RESULTS,
)


@pytest.fixture
def fleet():
    return make_fleet()


# --- attacks: each builds the raw messages B pushes to npc:inbox ------------------------------
def as_a_with_b_key(f):
    """B signs with its own key but names A (with B's kid, then with A's kid)."""
    out = []
    for kind, body in bodies_for_a(f):
        out.append(sealed(f.b, kind, body, node=f.a.node))
        out.append(sealed(f.a, kind, body, key=f.b.key))
    return out


def no_credential(f):
    """A random key: with an unknown kid, and with A's kid."""
    out = []
    for kind, body in bodies_for_a(f):
        out.append(sealed(random_identity(f.a.node, 987_654_321), kind, body))
        out.append(sealed(random_identity(f.a.node, f.a.kid), kind, body))
        out.append(sealed(f.a, kind, body, key=b""))  # an empty key
    return out


def bodies_for_a(f) -> list[tuple[str, dict]]:
    """What an impersonator would like A to have said."""
    return [
        (HB, beat(f.a.node, address="10.66.6.6", chips=0)),
        (REPORT, engine_report(f.a.node, f.replica, at=YEAR_2099.isoformat())),
        (LOGS, log_batch(f.a.node, f.replica)),
        (CHECKS, check_report(f.a.node, f.run.pk)),
    ]


def b_names_a_in_body(f):
    """B's genuine signature, but the body says node A."""
    return [sealed(f.b, kind, body) for kind, body in bodies_for_a(f)]


def b_writes_a_replica(f):
    """B reports A's replica failed (dated 2099: would freeze its state for 7 days, open an
    incident and fire a signed webhook), ready, stopped; ships log lines for it; beats with
    engine metrics for it; answers A's check run."""
    b = f.b.node
    return [
        sealed(f.b, REPORT, engine_report(b, f.replica, at=YEAR_2099.isoformat())),
        sealed(f.b, REPORT, engine_report(b, f.replica, phase="crash-loop")),
        sealed(f.b, REPORT, engine_report(b, f.replica, phase="stopped")),
        sealed(f.b, REPORT, engine_report(b, f.replica, phase="ready", generation=99)),
        sealed(f.b, LOGS, log_batch(b, f.replica)),
    ]


def future_and_past(f):
    """B's own credential, dated an hour ahead, in 2099, two hours ago; and no date at all."""
    body = beat(f.b.node)
    out = [
        sealed(f.b, HB, body, t=time.time() + 3600),
        sealed(f.b, HB, body, t=YEAR_2099.timestamp()),
        sealed(f.b, HB, body, t=time.time() - 7200),
        sealed(f.b, HB, body, t=time.time() - channel.MAX_AGE_S - 5),
    ]
    for t in (None, "now", True, float("nan")):
        doc = {"v": 1, "n": f.b.node, "kid": f.b.kid, "k": HB, "s": 1, "b": body}
        out.append(channel.seal(f.b.key, doc | ({"t": t} if t is not None else {})))
    return out


def junk(f):
    """Not a sealed message at all, or sealed around something that is not a message."""
    key = f.b.key
    deep = b'{"v":1,"n":"%s","kid":%d,"k":"console.heartbeat","t":%f,"s":%d,"b":%s}' % (
        f.b.node.encode(),
        f.b.kid,
        time.time(),
        time.time_ns(),
        b'{"a":' * 5000 + b"1" + b"}" * 5000,
    )
    return [
        b"",
        b"not json at all",
        b"\x00\xff" * 100,
        json.dumps({"v": 1, "n": f.a.node, "kid": f.a.kid, "k": HB, "b": {}}).encode(),
        b"0" * 64 + b".{}",
        b"0" * 64 + b".not json",
        seal_bytes(key, b"[1,2,3]"),
        seal_bytes(key, b'"a string"'),
        seal_bytes(key, b'{"v":2,"n":"x"}'),
        seal_bytes(key, b'{"v":1,"n":"' + f.b.node.encode() + b'","kid":"1","s":1}'),
        seal_bytes(key, b'{"v":1,"n":["x"],"kid":1,"s":1}'),
        seal_bytes(key, b'{"v":1,"n":"x","kid":1,"s":1e400}'),
        seal_bytes(key, b'{"v":1,"n":"x","kid":1,"s":NaN}'),
        seal_bytes(key, b'{"v":1,"n":"x","kid":1,"s":100000000000000000000000000000}'),
        seal_bytes(key, deep),  # nested 5,000 deep: past orjson's limit
        b"0" * 64 + b"." + b"[" * 100_000,
        b"x" * (10 * 1024 * 1024),  # 10 MB
        channel.seal(key, {"v": 1, "pad": "x" * (channel.MAX_MESSAGE_BYTES + 1)}),
        sealed(f.b, "console.anything", {"node": f.b.node}),  # unknown kind
        sealed(f.b, "__class__", {"node": f.b.node}),
        sealed(f.b, HB, [1, 2, 3]),  # body not an object
        sealed(f.b, HB, "beat"),
    ]


def hostile_heartbeats(f):
    """B's own, validly signed heartbeats with hostile field values."""
    b = f.b.node
    engine = {
        "node": b,
        "replica_id": f.replica_b.pk,
        "generation": 3,
        "phase": "ready",
        "at": timezone.now().isoformat(),
    }
    bad_chip = beat(b)["chips"][0]
    return [
        sealed(f.b, HB, beat(b, chips=1000)),
        sealed(f.b, HB, beat(b, host={"cpu_cores": {"logical": 2**62}})),
        sealed(f.b, HB, beat(b, host={"memory_total_mb": 2**60})),
        sealed(f.b, HB, beat(b, interval_s=-1)),
        sealed(f.b, HB, beat(b, chips=0) | {"chips": [bad_chip | {"npu_id": -1}]}),
        sealed(f.b, HB, beat(b, chips=0) | {"chips": [bad_chip | {"name": "x" * 100_000}]}),
        sealed(f.b, HB, beat(b, engines=[engine | {"metrics": {"num_requests_running": "5"}}])),
        sealed(f.b, HB, beat(b, engines=[{k: v for k, v in engine.items() if k != "replica_id"}])),
        sealed(f.b, HB, beat(b, engines=[engine] * 1000)),
        sealed(f.b, HB, beat(b) | {"node": "Victim; DROP TABLE"}),
        sealed(f.b, HB, beat(b, host={"address": "127.0.0.1:9/evil?x="})),
        sealed(f.b, HB, beat(b, host={"address": "http://10.1.0.1/"})),
        sealed(f.b, HB, beat(b, host={"hostname": "a/../../x?y=z"})),
        sealed(f.b, HB, beat(b, host={"cpu_percent": float("nan")})),  # NaN: not JSON
        sealed(f.b, HB, beat(b, chips=0) | {"chips": [bad_chip | {"temperature_c": 1e999}]}),
        sealed(f.b, HB, beat(b, chips=0) | {"chips": [bad_chip | {"hbm_used_mb": 10**30}]}),
    ]


def hostile_reports(f):
    """B's own engine reports, log lines and check results with hostile values."""
    b = f.b.node
    return [
        sealed(f.b, REPORT, engine_report(b, f.replica_b) | {"replica_id": "1"}),
        sealed(
            f.b,
            REPORT,
            {k: v for k, v in engine_report(b, f.replica_b).items() if k != "replica_id"},
        ),
        sealed(f.b, REPORT, engine_report(b, f.replica_b, restarts=-5)),
        sealed(f.b, REPORT, engine_report(b, f.replica_b, exit_code=2**70)),
        sealed(f.b, REPORT, engine_report(b, f.replica_b, log_tail=["x" * 100_000])),
        sealed(f.b, LOGS, log_batch(b, f.replica_b, lines=["x" * 20_000])),
        sealed(f.b, LOGS, log_batch(b, f.replica_b) | {"first_line_no": 0}),
        sealed(f.b, CHECKS, check_report(b, None) | {"results": "none"}),
        sealed(f.b, CHECKS, check_report(b, None) | {"run_id": -1}),
    ]


ATTACKS = {
    "impersonation-with-b-key": (as_a_with_b_key, {"identity", "signature"}),
    "no-credential": (no_credential, {"identity", "signature"}),
    "b-names-a-in-the-body": (b_names_a_in_body, {"impersonation"}),
    "b-writes-a-replica": (b_writes_a_replica, {"not-yours", "invalid", "future"}),
    "future-and-past": (future_and_past, {"future", "stale", "malformed"}),
    "junk-and-huge": (junk, {"malformed", "too-large", "kind", "identity"}),
    "hostile-heartbeat-fields": (hostile_heartbeats, {"invalid", "impersonation", "malformed"}),
    "hostile-report-fields": (hostile_reports, {"invalid", "not-yours"}),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_is_refused_and_changes_nothing_of_a(fleet, attack):
    build, codes = ATTACKS[attack]
    raws = build(fleet)
    before, counted = snapshot(fleet), refusal_counts()

    outcome = fleet.send(*raws)

    assert snapshot(fleet) == before
    refused = refused_since(counted)  # (>=: another run may share this Redis)
    assert sum(refused.get(code, 0) for code in codes) >= len(raws), (refused, len(raws))
    assert outcome.get("error", 0) == 0, outcome
    fleet.genuine_beat_accepted()


def test_each_attack_is_refused_under_its_reason(fleet):
    """One message each, to pin the reason code an operator sees on /metrics."""
    f, a = fleet, fleet.a.node
    cases = {
        "identity": sealed(f.b, HB, beat(a), node=a),
        "signature": sealed(f.a, HB, beat(a), key=f.b.key),
        "impersonation": sealed(f.b, HB, beat(a)),
        "not-yours": sealed(f.b, LOGS, log_batch(f.b.node, f.replica)),
        "future": sealed(f.b, HB, beat(f.b.node), t=time.time() + 3600),
        "stale": sealed(f.b, HB, beat(f.b.node), t=time.time() - 7200),
        "malformed": b"not a message",
        "too-large": b"x" * (10 * 1024 * 1024),
        "kind": sealed(f.b, "console.anything", {}),
        "invalid": sealed(f.b, LOGS, log_batch(f.b.node, f.replica_b) | {"lines": "x"}),
    }
    for code, raw in cases.items():
        counted = refusal_counts()
        f.send(raw)
        assert refused_since(counted).get(code, 0) >= 1, (code, refused_since(counted))
    assert Replica.objects.get(pk=f.replica.pk).state == "ready"


def test_replay_of_a_genuine_message_and_of_an_older_seq_is_refused(fleet):
    f = fleet
    older = sealed(f.a, REPORT, engine_report(f.a.node, f.replica, phase="unhealthy"))
    first = sealed(f.a, REPORT, engine_report(f.a.node, f.replica, phase="ready"))
    assert f.send(first) == {"ok": 1}
    before, counted = snapshot(f), refusal_counts()

    assert f.send(first, first, older) == {"replay": 3}
    # a second console process (a new leader) loads the seen sequence numbers from Redis
    assert Inbox().handle_batch([first, older]) == {"replay": 2}

    assert snapshot(f) == before
    assert refused_since(counted).get("replay", 0) >= 5
    f.genuine_beat_accepted()


def test_replay_is_refused_after_the_lease_moves_away_and_back(fleet, monkeypatch):
    """Two console workers: the lease moves from one to two (one stalled past LEASE_MS) and
    back. A message two handled, replayed (read from the Redis list by a host without ACLs)
    once one leads again, is still a replay."""
    f, r = fleet, get_redis()
    # the consumer closes stale connections before each batch; the test's transaction is one
    monkeypatch.setattr("console.inventory.inbox.close_old_connections", lambda: None)
    r.delete(LEADER_KEY)
    one, two = Consumer(), Consumer()
    try:
        assert one.hold_lease()
        r.rpush(channel.INBOX_KEY, sealed(f.a, HB, beat(f.a.node, address="10.1.0.1")))
        one.step(block_s=0.1)
        r.delete(LEADER_KEY)  # one stalls past its lease; two takes over
        assert two.hold_lease()
        captured = sealed(f.a, REPORT, engine_report(f.a.node, f.replica, phase="unhealthy"))
        r.rpush(channel.INBOX_KEY, captured)
        two.step(block_s=0.1)
        assert Replica.objects.get(pk=f.replica.pk).state == "unhealthy"
        Replica.objects.filter(pk=f.replica.pk).update(state="ready")  # the operator fixed it
        r.delete(LEADER_KEY)
        assert one.hold_lease()  # back to the first: an attacker replays what it read
        counted = refusal_counts()
        r.rpush(channel.INBOX_KEY, captured)
        one.step(block_s=0.1)
        assert refused_since(counted).get("replay", 0) == 1
        assert Replica.objects.get(pk=f.replica.pk).state == "ready"
    finally:
        r.delete(LEADER_KEY)


def test_a_revoked_credential_is_refused_within_a_second(
    fleet, admin_user, django_capture_on_commit_callbacks
):
    f = fleet
    f.inbox.creds.check_s = 0.0  # the production cache checks the version key once a second
    assert f.send(sealed(f.b, HB, beat(f.b.node))) == {"ok": 1}
    with django_capture_on_commit_callbacks(execute=True):
        assert revoke_credential(actor=Actor(user=admin_user, name="ada"), name=f.b.node) == 1
    before, counted = snapshot(f), refusal_counts()
    b_before = Node.objects.filter(pk=f.node_b.pk).values("last_heartbeat", "address").get()

    outcome = f.send(
        sealed(f.b, HB, beat(f.b.node)),
        sealed(f.b, REPORT, engine_report(f.b.node, f.replica_b)),
        sealed(f.b, HB, beat(f.a.node), node=f.a.node),
    )

    assert outcome == {"identity": 3}
    assert refused_since(counted).get("identity", 0) >= 3
    assert snapshot(f) == before
    assert Node.objects.filter(pk=f.node_b.pk).values("last_heartbeat", "address").get() == b_before
    assert Replica.objects.get(pk=f.replica_b.pk).state == "ready"
    f.genuine_beat_accepted()


def test_engine_metrics_for_a_replica_of_a_never_land(fleet):
    """B's heartbeat lists A's replica with flattering metrics (routing would send it traffic)
    and a failed phase; the reconcile loop's repair from heartbeats must not apply it either."""
    f = fleet
    forged = engine_report(f.b.node, f.replica, phase="failed") | {
        "metrics": {"num_requests_running": 0.0, "kv_cache_usage_perc": 0.0}
    }
    own = engine_report(f.b.node, f.replica_b, phase="ready") | {
        "metrics": {"num_requests_running": 1.0}
    }
    before = snapshot(f)

    assert f.send(sealed(f.b, HB, beat(f.b.node, address="10.2.0.2", engines=[forged, own]))) == {
        "ok": 1
    }
    repair_from_heartbeats()

    assert get_redis().get(metrics_key(f.replica.pk)) is None
    assert get_redis().get(metrics_key(f.replica_b.pk))  # B's own replica: recorded
    assert snapshot(f) == before
    f.genuine_beat_accepted()


def test_forged_failure_opens_no_incident_and_fires_no_webhook(fleet, monkeypatch):
    """The positive control first: A's own failure report does open an incident."""
    f, sent = fleet, []
    monkeypatch.setenv("INCIDENT_WEBHOOK_URL", "http://127.0.0.1:9/hook")
    monkeypatch.setattr("console.diagnosis.webhooks.dispatch", lambda *a: sent.append(a))
    incidents = Incident.objects.count()

    f.send(
        sealed(f.b, REPORT, engine_report(f.b.node, f.replica, at=YEAR_2099.isoformat())),
        sealed(f.b, REPORT, engine_report(f.a.node, f.replica)),
        sealed(f.b, LOGS, log_batch(f.b.node, f.replica, lines=["ERROR NPU out of memory"] * 50)),
    )
    assert Incident.objects.count() == incidents and not sent
    assert get_redis().get(f"npc:engine-applied:{f.replica.pk}") is None

    assert f.send(sealed(f.a, REPORT, engine_report(f.a.node, f.replica))) == {"ok": 1}
    assert Replica.objects.get(pk=f.replica.pk).state == "failed"  # A itself may say so


def test_check_results_of_b_never_touch_a_run(fleet):
    f = fleet
    before = snapshot(f)
    outcome = f.send(
        sealed(f.b, CHECKS, check_report(f.a.node, f.run.pk)),
        sealed(f.b, CHECKS, check_report(f.b.node, f.run.pk, ok=True)),
    )
    assert outcome == {"impersonation": 1, "ok": 1}
    assert snapshot(f) == before
    assert NodeCheckRun.objects.get(pk=f.run.pk).status == "pending"
    # what B sent became a run of B's own, not an answer to A's
    assert NodeCheckRun.objects.filter(node=f.node_b).count() == 1


def test_a_reported_address_never_becomes_another_node_address(fleet):
    """B reports A's address, then a URL-ish address: refused or at most pending for B; A's
    address and every replica's base_url keep A's."""
    f = fleet
    before = snapshot(f)
    f.send(
        sealed(f.b, HB, beat(f.b.node, address="127.0.0.1:9/evil?x=")),
        sealed(f.b, HB, beat(f.b.node, address="10.1.0.1")),
    )
    assert snapshot(f) == before
    b = Node.objects.get(pk=f.node_b.pk)
    assert b.address == "10.2.0.2" and b.pending_address in {"", "10.1.0.1"}
    replica = Replica.objects.select_related("node", "deployment").get(pk=f.replica.pk)
    assert replica.base_url == f"http://10.1.0.1:{f.replica.port}"
    assert Node.objects.filter(address__contains="evil").count() == 0
    assert Node.objects.filter(pending_address__contains="evil").count() == 0


def test_a_thousand_attempts_leave_one_audit_entry_per_reason_and_a_keeps_beating(
    fleet, monkeypatch
):
    """1,000 forged beats naming A and 1,000 of B's log batches for A's replica in one batch,
    then A's own beat. B's log bucket (its burst, here 100) runs dry: the rest of its flood
    is refused as over the rate."""
    monkeypatch.setattr("console.inventory.inbox.BURST", 100.0)
    f = fleet
    forged = [sealed(f.b, HB, beat(f.a.node), node=f.a.node) for _ in range(1000)]
    not_yours = [sealed(f.b, LOGS, log_batch(f.b.node, f.replica)) for _ in range(1000)]
    audits_before = len(refusal_audits())
    before, counted = snapshot(f), refusal_counts()

    outcome = f.send(*forged, *not_yours, sealed(f.a, HB, beat(f.a.node, address="10.1.0.1")))

    assert outcome["identity"] == 1000 and outcome["ok"] >= 1 and outcome["rate"] >= 850
    assert LogLine.objects.count() == before["log_lines"]
    refused = refused_since(counted)
    assert refused.get("identity", 0) >= 1000
    assert refused.get("not-yours", 0) + refused.get("rate", 0) >= 1000
    b_audits = refusal_audits(f.b.node)
    assert sorted(m.split(":")[0] for m in b_audits) == ["not-yours", "rate"], b_audits
    # anonymous refusals share one audit slot a minute per reason (another test may hold it)
    assert len(refusal_audits()) - audits_before - len(b_audits) <= 1
    assert refusal_audits(f.a.node) == []  # nothing is blamed on the victim
    after = snapshot(f)
    assert after["node"]["status"] == "online"
    # A's beat in the same batch went through: its latest telemetry moved
    assert after["redis"]["latest"] != before["redis"]["latest"]
    f.genuine_beat_accepted()


def test_a_refusal_is_audited_once_a_minute_per_node_and_reason(fleet):
    f = fleet
    for _ in range(3):
        f.send(*[sealed(f.b, HB, beat(f.b.node), t=time.time() + 3600) for _ in range(10)])
    assert [m.split(":")[0] for m in refusal_audits(f.b.node)] == ["future"]
    entry = AuditEntry.objects.get(action="node.refused", object_repr=f.b.node)
    assert f.b.node in entry.actor


def test_seq_far_ahead_locks_out_only_the_sender(fleet):
    """B pushes its own seq to the maximum: B is stuck (its problem), A is not."""
    f = fleet
    assert f.send(sealed(f.b, HB, beat(f.b.node), seq=2**63 - 1)) == {"ok": 1}
    assert f.send(sealed(f.b, HB, beat(f.b.node))) == {"replay": 1}
    f.genuine_beat_accepted()


def test_message_with_a_random_key_for_every_node_name_changes_nothing(fleet):
    """An anonymous flood naming real and unknown nodes: nothing registered, nothing changed."""
    f = fleet
    names = [f.a.node, f.b.node, "new-node", "x" * 63]
    nodes = Node.objects.count()
    raws = [
        sealed(random_identity(n, k), HB, beat(n if len(n) < 60 else "y"))
        for n in names
        for k in (1, f.a.kid, f.b.kid, secrets.randbelow(2**31))
    ]
    before = snapshot(f)
    outcome = f.send(*raws)
    assert set(outcome) <= {"identity", "signature"}
    assert Node.objects.count() == nodes
    assert snapshot(f) == before
    f.genuine_beat_accepted()


def test_refusals_are_exported_on_metrics(fleet):
    """An operator sees the attack on /metrics: npc_node_refusals_total{reason}."""
    from console.telemetry.prometheus import render_metrics

    fleet.send(sealed(fleet.b, HB, beat(fleet.a.node), node=fleet.a.node))
    assert 'npc_node_refusals_total{reason="identity"}' in render_metrics()
