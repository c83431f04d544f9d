"""The network probes before a multi-host NPU replica starts (groups.check_connectivity): each
member's agent is asked (a record and a poll, console/deployments/netprobe.py) to ping its
peers' same-numbered NPUs and, for a follower, the leader's DP RPC port; nothing starts until
every answer is in and passes, or the deployment's preflight_override lets it through. The
answers here go through the console's inbox, sealed with each node's own key."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from console.accounts.services import Actor
from console.deployments import groups, netprobe
from console.deployments.models import NetProbe, NpuAllocation, Replica
from console.deployments.reconcile import reconcile
from console.hot import get_redis
from console.inventory.models import Accelerator, CheckRunStatus, NodeCheckRun
from tests.console.deployments.test_groups import host, start_group
from tests.node_support import deliver, enroll_node, sealed
from workers.contracts import MANIFEST_SCHEME, Tasks


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    out = []
    monkeypatch.setattr(
        "console.deployments.engines.send_on_commit",
        lambda node, task, args: out.append((task, node)),
    )
    return out


@pytest.fixture(autouse=True)
def checked(monkeypatch, fake_inspect):
    """The static preflight (test_preflight.py) passes and the weights are the same
    (test_group_weights.py): what is left is the probes."""
    monkeypatch.setattr(groups, "check_preflight", lambda r: "")
    same = {"scheme": MANIFEST_SCHEME, "digest": "0" * 64, "files_total": 0, "files": []}
    monkeypatch.setattr(
        groups, "member_manifests", lambda r: [(m.node.name, same) for m in groups.members(r)]
    )


@pytest.fixture
def actor(operator):
    return Actor(user=operator, name="otto")


def npu_host(name: str, address: str, subnet: int, *, vnic: int | None = None):
    """A host whose last npu-network check reported NPU IPs 10.20.<subnet>.1x (and vNIC IPs)."""
    node = host(name, address)
    ips = " ".join(f"{d}=10.20.{subnet}.{10 + d}/24" for d in range(8))
    evidence = f"NPU IPs: {ips}."
    if vnic is not None:
        evidence += (
            " vNIC IPs: " + " ".join(f"{d}=10.30.{vnic}.{10 + d}/24" for d in range(8)) + "."
        )
    NodeCheckRun.objects.create(
        node=node,
        status=CheckRunStatus.PASSED,
        finished_at=timezone.now(),
        results=[{"name": "npu-network", "ok": True, "evidence": evidence + " TLS: off."}],
    )
    return node


@pytest.fixture
def hosts(db):
    a, b = npu_host("n1", "10.0.1.1", 1), npu_host("n2", "10.0.1.2", 2)
    return {"n1": enroll_node("n1"), "n2": enroll_node("n2")}, (a, b)


def answer(identity, override: dict | None = None) -> None:
    """The node's agent answers its pending probe: every target ok, except `override`'s
    (address -> (ok, detail))."""
    probe = NetProbe.objects.get(node__name=identity.node, status="pending")
    results = []
    for t in probe.targets:
        ok, detail = (override or {}).get(t["address"], (True, "3/3 replies, 0% loss"))
        results.append({**t, "ok": ok, "detail": detail})
    body = {"node": identity.node, "probe_id": probe.pk, "results": results}
    assert deliver(sealed(identity, Tasks.NET_PROBE, body)) == {"ok": 1}


def test_the_group_waits_for_the_probes_then_starts_when_all_pass(actor, hosts, sent):
    ids, _ = hosts
    replica = start_group(actor, preflight_override="")
    assert replica.state == "pending" and not NpuAllocation.objects.exists() and not sent
    assert replica.state_reason == "waiting for the network probes on n1, n2"
    leader, follower = (p for p in NetProbe.objects.order_by("node__name"))
    # the leader pings the follower's NPU i from its NPU i; the follower also the RPC port
    assert leader.targets[0] == {
        "kind": "npu-ping",
        "address": "10.20.2.10",
        "npu": 0,
        "port": None,
        "hccs": False,
    }
    assert [t["kind"] for t in leader.targets] == ["npu-ping"] * 8
    port = follower.targets[-1]
    assert port["kind"] == "port" and port["address"] == "10.0.1.1"
    assert len(follower.targets) == 9 and port["port"] >= 1024

    answer(ids["n1"])
    reconcile()
    assert Replica.objects.get().state_reason == "waiting for the network probes on n2"
    assert NetProbe.objects.count() == 2  # the pending ask is not repeated
    answer(ids["n2"])
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "scheduled"
    assert "network probes passed (17)" in replica.events.get(to_state="scheduled").reason
    assert sorted(n for task, n in sent if task == "host.start_replica") == ["n1", "n2"]


def test_a_failed_ping_holds_the_group_naming_both_nodes_the_npu_and_the_address(
    actor, hosts, sent
):
    ids, _ = hosts
    start_group(actor, preflight_override="")
    answer(ids["n1"], {"10.20.2.13": (False, "0/3 replies, 100% loss, 3 failed")})
    answer(ids["n2"])
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "pending" and not NpuAllocation.objects.exists() and not sent
    assert replica.state_reason.startswith("network probes between the members failed")
    assert "n1: npu-ping: to n2 NPU 3 -> 10.20.2.13: 0/3 replies" in replica.state_reason


def test_an_override_lets_a_failed_probe_through_and_records_it(actor, hosts, sent):
    ids, _ = hosts
    start_group(actor, preflight_override="")
    answer(ids["n1"])
    answer(ids["n2"], {"10.0.1.1": (False, "10.0.1.1:40000: no answer within 3s")})
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "pending" and "n2: port: to n1 10.0.1.1:" in replica.state_reason
    dep = replica.deployment
    dep.preflight_override = "port opened by hand, ticket 7"
    dep.save(update_fields=["preflight_override"])
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "scheduled"
    event = replica.events.get(to_state="scheduled").reason
    assert "network probes: preflight overridden: port opened by hand, ticket 7" in event
    assert "n2: port: to n1 10.0.1.1:" in event


def test_an_agent_that_never_answers_fails_its_probe_and_blocks(actor, hosts, sent):
    ids, _ = hosts
    start_group(actor, preflight_override="")
    answer(ids["n1"])
    NetProbe.objects.filter(node__name="n2").update(
        requested_at=timezone.now() - netprobe.ANSWER_TIMEOUT - timedelta(seconds=1)
    )
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "pending" and "n2: net-probe: the agent did not answer" in (
        replica.state_reason
    )


def test_a3_hosts_ping_the_peers_vnic_with_hccs_ping(actor, db, sent):
    npu_host("n1", "10.0.1.1", 1, vnic=1)
    npu_host("n2", "10.0.1.2", 2, vnic=2)
    Accelerator.objects.update(model_name="Ascend910")
    start_group(actor, preflight_override="")
    first = NetProbe.objects.get(node__name="n1").targets[0]
    assert (first["address"], first["hccs"], first["npu"]) == ("10.30.2.10", True, 0)


def test_cpu_groups_are_not_probed(actor, db):
    class Replica_:
        deployment = type("D", (), {"device": "cpu"})()

    assert groups.check_connectivity(Replica_()) == ""
    assert not NetProbe.objects.exists()


def test_an_answer_from_another_node_is_refused(actor, hosts):
    ids, _ = hosts
    start_group(actor, preflight_override="")
    probe = NetProbe.objects.get(node__name="n1")
    body = {"node": "n2", "probe_id": probe.pk, "results": []}
    assert deliver(sealed(ids["n2"], Tasks.NET_PROBE, body)) == {"ok": 1}  # authentic, not its
    probe.refresh_from_db()
    assert probe.status == "pending" and probe.results == []
    assert get_redis().exists("npc:refusal-audit:n2:not-yours")
    hostile = {"node": "n1", "probe_id": probe.pk, "results": [{"kind": "port"}] * 65}
    assert deliver(sealed(ids["n1"], Tasks.NET_PROBE, hostile)) == {"invalid": 1}


def test_the_ask_is_sent_signed_once_the_transaction_commits(
    actor, hosts, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        start_group(actor, preflight_override="")
    from workers import channel

    raws = get_redis().lrange(channel.cmd_key("n2"), 0, -1)
    assert raws and any(b"host.net_probe" in r for r in raws)
