"""Replicas over several hosts (console/deployments/groups.py): gang placement, one start per
member built from the hosts' own facts, the group's state from its members' reports, group
restarts with backoff and crash-loop, stop on every member, a lost member's node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from console.accounts.services import Actor
from console.deployments import groups, services
from console.deployments.engines import apply_report, build_spec
from console.deployments.models import NpuAllocation, Replica, ReplicaMember
from console.deployments.reconcile import reconcile
from console.deployments.schemas import DeploymentIn
from console.diagnosis.models import Incident
from console.inventory.models import Node
from tests.console.deployments.test_scheduling import SPEC
from tests.kit import make_node
from workers.contracts import MANIFEST_SCHEME

GROUP = SPEC | {
    "replicas": 1,
    "tensor_parallel_size": 4,
    "data_parallel_size": 4,
    "npus_per_replica": 16,
    "nodes_per_replica": 2,
    "enable_expert_parallel": True,
    # these hosts are rows, not Ascend servers: nothing reports an NPU network to check
    "preflight_override": "test hosts without an NPU network",
}


@pytest.fixture
def actor(operator):
    return Actor(user=operator, name="otto")


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    """What reconcile dispatches: (task, node, spec or args)."""
    out = []
    monkeypatch.setattr(
        "console.deployments.engines.send_on_commit",
        lambda node, task, args: out.append((task, node, args[0] if args else None)),
    )
    return out


@pytest.fixture(autouse=True)
def same_model(monkeypatch):
    """Every member's agent read the same model (the comparison itself, with the agents'
    real inspections: test_group_weights.py)."""
    same = {"scheme": MANIFEST_SCHEME, "digest": "0" * 64, "files_total": 0, "files": []}
    monkeypatch.setattr(
        groups, "member_manifests", lambda r: [(m.node.name, same) for m in groups.members(r)]
    )


@pytest.fixture(autouse=True)
def reachable(monkeypatch):
    """The members reach each other (the probes themselves: test_group_network.py)."""
    monkeypatch.setattr(groups, "check_connectivity", lambda r: "")


def host(name: str, address: str, npus: int = 8, **labels) -> Node:
    node = make_node(name, npus=npus, address=address, labels=labels)
    node.interfaces = {"lo": ["127.0.0.1"], "enp189s0f0": [f"{address}/24"]}
    node.save(update_fields=["interfaces"])
    return node


def start_group(actor, **spec) -> Replica:
    services.create_deployment(
        actor=actor, payload=DeploymentIn(name="ds", **GROUP | spec | {"desired_state": "running"})
    )
    reconcile()
    return Replica.objects.get()


def report(replica: Replica, node: str, phase: str, **extra):
    return apply_report(
        {
            "replica_id": replica.pk,
            "generation": replica.generation,
            "phase": phase,
            "at": datetime.now(UTC).isoformat(),
            **extra,
        },
        node=node,
    )


def test_a_group_is_placed_as_a_gang_preferring_one_network_domain(actor, fake_inspect, sent):
    host("a1", "10.0.1.1", **{"network-domain": "sw-a"})
    host("b1", "10.0.2.1", **{"network-domain": "sw-b"})
    host("b2", "10.0.2.2", **{"network-domain": "sw-b"})
    replica = start_group(actor)
    assert replica.state == "scheduled"
    members = list(replica.members.order_by("rank").values_list("node__name", flat=True))
    assert sorted(members) == ["b1", "b2"]  # the domain that holds the whole group
    assert NpuAllocation.objects.filter(replica=replica).count() == 16
    assert replica.node.name == members[0] and replica.port and replica.rpc_port
    assert replica.port != replica.rpc_port
    starts = [(node, spec) for task, node, spec in sent if task == "host.start_replica"]
    assert sorted(n for n, _ in starts) == ["b1", "b2"]
    by_rank = {spec["group"]["rank"]: (node, spec) for node, spec in starts}
    leader_node, leader = by_rank[0]
    follower_node, follower = by_rank[1]
    leader_ip = Node.objects.get(name=leader_node).address
    for node, spec in (by_rank[0], by_rank[1]):
        assert spec["group"]["leader_address"] == leader_ip
        assert spec["group"]["local_address"] == Node.objects.get(name=node).address
        assert spec["group"]["interface"] == "enp189s0f0"
        assert spec["group"]["rpc_port"] == replica.rpc_port and spec["restart_max"] == 0
        assert len(spec["npu_ids"]) == 8 and spec["node"] == node
    assert follower["group"]["fabric"] == "a2" and follower_node != leader_node


def test_too_few_hosts_hold_nothing_and_say_why(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2", npus=4)  # not enough NPUs for its share
    replica = start_group(actor)
    assert replica.state == "pending" and "needs 2 online hosts with 8 free" in replica.state_reason
    assert not NpuAllocation.objects.exists() and not sent


def test_a_host_without_its_interface_holds_nothing_until_it_reports_one(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    b = host("a2", "10.0.1.2")
    b.interfaces = {"lo": ["127.0.0.1"]}
    b.save(update_fields=["interfaces"])
    replica = start_group(actor)
    assert replica.state == "pending" and "no network interface holding" in replica.state_reason
    assert not NpuAllocation.objects.exists() and not sent
    b.interfaces = {"eth0": ["10.0.1.2"]}
    b.save(update_fields=["interfaces"])
    reconcile()
    assert Replica.objects.get().state == "scheduled"


def test_ready_follows_the_leader_and_a_member_failure_fails_the_group(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor)
    leader, follower = (m.node.name for m in groups.members(replica))
    report(replica, follower, "ready", pid=41)  # a headless member alive
    assert Replica.objects.get().state == "scheduled"  # the leader has not said anything
    report(replica, leader, "loading")
    report(replica, leader, "ready", pid=40)
    replica = Replica.objects.get()
    assert replica.state == "ready" and replica.pid == 40
    member = ReplicaMember.objects.get(replica=replica, rank=1)
    assert (member.phase, member.pid) == ("ready", 41)

    report(replica, follower, "failed", reason="exited with code 1", exit_code=1)
    replica = Replica.objects.get()
    assert replica.state == "failed"
    assert f"member rank 1 on {follower}: exited with code 1" in replica.state_reason
    report(replica, leader, "ready")  # the leader's late word does not hide the failure
    assert Replica.objects.get().state == "failed"
    incident = Incident.objects.get()  # names the member the failure came from
    assert incident.node.name == follower
    assert f"rank 1 of 2, NPUs 0,1,2,3,4,5,6,7 on {follower}" in incident.subject


def test_a_failed_group_restarts_every_member_after_backoff_then_gives_up(
    actor, fake_inspect, sent, monkeypatch
):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor)
    follower = groups.members(replica)[1].node.name
    for attempt in range(groups.RESTART_MAX):
        replica = Replica.objects.get()
        sent.clear()
        report(replica, follower, "crash-loop", reason="killed by signal 9")
        Replica.objects.filter(pk=replica.pk).update(
            state_changed_at=datetime.now(UTC) - timedelta(seconds=groups.BACKOFF_MAX_S + 1)
        )
        reconcile()
        replica = Replica.objects.get()
        if attempt < groups.RESTART_MAX - 1:
            assert replica.state == "starting" and replica.restarts == attempt + 1
            starts = {n for task, n, spec in sent if task == "host.start_replica"}
            assert starts == {m.node.name for m in groups.members(replica)}  # every member
            assert all(s["generation"] == replica.generation for t, _, s in sent if s)
    assert replica.state == "crash-loop" and "group failures" in replica.state_reason
    stops = {n for task, n, _ in sent if task == "host.stop_replica"}
    assert stops == {m.node.name for m in groups.members(replica)}


def test_the_backoff_holds_a_restart(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor)
    report(replica, groups.members(replica)[1].node.name, "failed", reason="boom")
    sent.clear()
    reconcile()  # the first backoff (2 s) has not passed
    assert Replica.objects.get().state == "failed" and not sent


def test_stop_goes_to_every_member_and_frees_everything_when_all_stopped(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor)
    leader, follower = (m.node.name for m in groups.members(replica))
    report(replica, leader, "ready")
    sent.clear()
    services.set_desired(actor=actor, name="ds", state="stopped")
    reconcile()
    assert {n for task, n, _ in sent if task == "host.stop_replica"} == {leader, follower}
    replica = Replica.objects.get()
    report(replica, leader, "stopped")
    assert Replica.objects.get().state == "stopping"  # the follower has not said so yet
    assert NpuAllocation.objects.filter(replica=replica).count() == 16
    report(replica, follower, "stopped")
    replica = Replica.objects.get()
    assert replica.state == "stopped" and not NpuAllocation.objects.exists()
    assert (replica.port, replica.rpc_port) == (None, None)


def test_a_members_node_going_offline_makes_the_group_unknown_not_stopped(
    actor, fake_inspect, sent
):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor)
    leader, follower = (m.node.name for m in groups.members(replica))
    report(replica, leader, "ready")
    sent.clear()
    Node.objects.filter(name=follower).update(status="offline")
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "unknown" and follower in replica.state_reason
    assert not [s for s in sent if s[0] == "host.stop_replica"]  # nobody torn down


def test_a_node_outside_the_group_cannot_move_it(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    host("x", "10.0.9.9")
    replica = start_group(actor)
    outsider = (
        Node.objects.exclude(name__in=[m.node.name for m in groups.members(replica)]).get().name
    )
    assert report(replica, outsider, "failed", reason="forged") is None
    assert Replica.objects.get().state == "scheduled"


def test_the_spec_of_a_single_host_replica_carries_no_group(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    services.create_deployment(
        actor=actor,
        payload=DeploymentIn(name="one", **SPEC | {"replicas": 1, "desired_state": "running"}),
    )
    reconcile()
    replica = Replica.objects.get()
    assert build_spec(replica).group is None
    (spec,) = [s for task, _, s in sent if task == "host.start_replica"]
    assert "group" not in spec and "numa_nodes" not in spec  # older agents still take it


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"data_parallel_size": 3, "npus_per_replica": 12}, "data_parallel_size"),
        ({"pinned_node": "a1"}, "nodes_per_replica"),
        (
            {"npus_per_replica": 15, "data_parallel_size": 15, "tensor_parallel_size": 1},
            "data_parallel_size",
        ),
    ],
)
def test_a_layout_that_does_not_split_over_the_hosts_is_refused(
    operator_client, fake_inspect, fields, field
):
    host("a1", "10.0.1.1")
    body = {"name": "ds", **GROUP, **fields}
    resp = operator_client.post("/api/v1/deployments", body, content_type="application/json")
    assert resp.status_code == 422 and resp.json()["field"] == field, resp.content


def test_a_failing_preflight_blocks_the_start_until_an_override_is_given(actor, fake_inspect, sent):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor, preflight_override="")
    assert replica.state == "pending" and "NPU-network preflight failed" in replica.state_reason
    assert "npu-network" in replica.state_reason and not NpuAllocation.objects.exists()
    assert not sent
    dep = replica.deployment
    dep.preflight_override = "links checked by hand, ticket 42"
    dep.save(update_fields=["preflight_override"])
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "scheduled"
    event = replica.events.get(to_state="scheduled")
    assert "preflight overridden: links checked by hand, ticket 42" in event.reason


def test_the_replica_card_lists_its_members(actor, fake_inspect, sent, operator_client):
    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor)
    leader, follower = groups.members(replica)
    report(replica, follower.node.name, "ready", pid=4242)
    body = operator_client.get("/deployments/ds/").content.decode()
    assert 'data-testid="replica-members"' in body
    assert "headless" in body and "4242" in body and f"DP RPC {replica.rpc_port}" in body
    assert "over 2 hosts" in body and "0,1,2,3,4,5,6,7" in body


def test_each_members_log_is_kept_apart_and_linked_from_the_incident(
    actor, fake_inspect, sent, operator_client
):
    from console.logs.models import LogLine
    from console.logs.services import ingest_batch

    host("a1", "10.0.1.1")
    host("a2", "10.0.1.2")
    replica = start_group(actor)
    leader, follower = (m.node.name for m in groups.members(replica))
    for node, text in ((leader, "leader line"), (follower, "HCCL timeout on the follower")):
        ingest_batch(
            payload={
                "node": node,
                "replica_id": replica.pk,
                "generation": replica.generation,
                "run": 1,
                "file": f"gen{replica.generation}-run1.log",
                "first_line_no": 1,
                "lines": [text],
            }
        )
    lines = dict(LogLine.objects.values_list("member", "text"))
    assert lines == {0: "leader line", 1: "HCCL timeout on the follower"}  # line 1 of both kept
    report(replica, follower, "failed", reason="exited with code 1")
    incident = Incident.objects.get()
    body = operator_client.get(f"/incidents/{incident.pk}/").content.decode()
    g = replica.generation
    assert f"?run=gen{g}-run1-rank1" in body and f'?run=gen{g}-run1"' in body
    page = operator_client.get(f"/replicas/{replica.pk}/logs/?run=gen{g}-run1-rank1")
    assert "HCCL timeout on the follower" in page.content.decode()
    assert "leader line" not in page.content.decode()
