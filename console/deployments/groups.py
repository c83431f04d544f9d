"""Replicas over several hosts (a deployment's nodes_per_replica > 1): one replica = one group.

The scheduler places a group as a gang (scheduler.place_group: NPUs on every host, the
leader's API and DP RPC ports, one ReplicaMember per host, in one transaction). This module
turns a placed group into one signed start per member, built from what the agents reported
(each host's address and the interface that carries it: workers/engine/group.py says which
flags and variables that makes), and keeps the group's state from its members' reports:

- the replica's state follows the leader (rank 0, which serves the API) while every other
  member is alive; vLLM's leader answers /health only once every DP rank has joined;
- any member that fails makes the whole group fail: the agents never restart a member on
  their own (restart_max 0), the reconcile loop restarts every member with a new generation,
  with backoff, and after RESTART_MAX group failures within RESTART_WINDOW gives up
  (crash-loop) — counted per group;
- stop goes to every member; the replica is stopped (and its NPUs and ports on every host
  freed) only when every member has said so;
- a member's node going offline makes the replica `unknown` (services.node_went_offline):
  healthy members are never torn down on a lost heartbeat alone;
- before a group is dispatched, every member's agent has read the model and the manifests
  (workers/engine/manifest.py: sizes, whole-file checksums of the small files, header and
  sampled-window checksums of the weights) are the same (check_weights);
- then the members reach each other (check_connectivity, NPU groups only): each member pings
  its peers' NPUs (same-numbered NPUs: NPU i of one host to NPU i of every other) and each
  follower checks the leader's DP RPC port (console/deployments/netprobe.py,
  workers/netprobe.py).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db.models import Q
from django.utils import timezone

from console.deployments.models import (
    InspectionStatus,
    Replica,
    ReplicaEvent,
    ReplicaMember,
    ReplicaState,
)
from console.inventory.models import Node
from workers.contracts import EnginePhase
from workers.engine.group import GroupSpec, interface_of
from workers.engine.policy import backoff_delay

if TYPE_CHECKING:
    from console.deployments.preflight import MemberFacts

log = logging.getLogger(__name__)
S = ReplicaState
RESTART_MAX = 5  # group failures within RESTART_WINDOW before crash-loop (as one host's engine)
RESTART_WINDOW = timedelta(minutes=10)
BACKOFF_BASE_S, BACKOFF_MAX_S = 2.0, 300.0
ENDED = {EnginePhase.STOPPED, EnginePhase.FAILED, EnginePhase.CRASH_LOOP}


class NoNetworkFacts(Exception):
    """A member's host has not reported what its group needs (an address, its interface)."""

    def __str__(self) -> str:
        return f"waiting for network facts: {self.args[0]}"


class PreflightFailed(Exception):
    """The NPU-network preflight of the chosen hosts fails and no override is given."""


class WeightsUnconfirmed(Exception):
    """The members' copies of the model are not known to be the same: an inspection is still
    pending or was refused, an agent sends no manifest, or the manifests differ."""


def check_preflight(replica: Replica) -> str:
    """The NPU-network preflight (preflight.py) of the placed hosts: raises PreflightFailed
    with every failing finding unless the deployment gives an override reason; returns what
    to record ("" for vllm-cpu groups, which have no NPU network)."""
    from console.deployments import preflight

    dep = replica.deployment
    if dep.device != "npu":
        return ""
    facts = [preflight.facts_for(m.node) for m in members(replica)]
    decision = preflight.blocking(
        preflight.preflight(facts, now=timezone.now()), dep.preflight_override
    )
    if decision.blocked:
        raise PreflightFailed(
            "NPU-network preflight failed (set preflight_override with a reason to start "
            "anyway): " + "; ".join(decision.reasons)
        )
    if decision.reasons:
        log.warning("replica %s: %s", replica, decision.record)
    return decision.record


class ProbesPending(WeightsUnconfirmed):
    """A member's agent has not answered its network probe yet (waits like the weights)."""


def probe_targets(
    own: MemberFacts,
    own_fabric: str,
    peers: list[tuple[str, str, MemberFacts]],
    port: tuple[str, str, int] | None,
) -> list[tuple[str, dict]]:
    """(peer node, workers.contracts.ProbeTarget) for one member. Pings: for each local NPU
    i, the peer's NPU i only (HCCL's hierarchical algorithms talk between same-numbered NPUs
    across hosts; every pair would be 16x16 per peer): the peer's vNIC IP with -hccs_ping when
    both hosts are A3 and report vNIC IPs, else its NPU IP with -ping. At most
    MAX_PROBE_TARGETS - 1 pings (the first peers' first NPUs), then `port`: (leader node,
    address, DP RPC port) for a follower."""
    from workers.contracts import MAX_PROBE_TARGETS

    found: list[tuple[str, dict]] = []
    for peer, peer_fabric, facts in peers:
        hccs = own_fabric == peer_fabric == "a3"
        for npu in sorted(own.npu_ips.keys() | own.vnic_ips.keys()):
            if hccs and npu in own.vnic_ips and npu in facts.vnic_ips:
                address, use_hccs = facts.vnic_ips[npu], True
            elif npu in own.npu_ips and npu in facts.npu_ips:
                address, use_hccs = facts.npu_ips[npu], False
            else:
                continue
            target = {"kind": "npu-ping", "npu": npu, "address": address.split("/", 1)[0]}
            found.append((peer, target | ({"hccs": True} if use_hccs else {})))
    found = found[: MAX_PROBE_TARGETS - 1]
    if port is not None:
        leader, address, number = port
        found.append((leader, {"kind": "port", "address": address, "port": number}))
    return found


def check_connectivity(replica: Replica) -> str:
    """The members reach each other (NPU groups; vllm-cpu groups talk over loopback: ""):
    asks each member's agent to run its probe_targets (never waits: a later pass reads the
    answers; ProbesPending meanwhile), then judges the answers with preflight.blocking and
    the deployment's preflight_override. Raises PreflightFailed with the failing probes, or
    returns what to record."""
    from console.deployments import netprobe, preflight

    dep = replica.deployment
    if dep.device != "npu":
        return ""
    group = members(replica)
    facts = {m.node.name: preflight.facts_for(m.node) for m in group}
    kinds = {m.node.name: fabric(m.node, dep.device) for m in group}
    leader = group[0]
    asked = []
    for m in group:
        name = m.node.name
        peers = [(p.node.name, kinds[p.node.name], facts[p.node.name]) for p in group if p != m]
        port = None
        if m.rank != leader.rank and replica.rpc_port:
            port = (leader.node.name, _address(leader.node, dep.device), replica.rpc_port)
        targets = probe_targets(facts[name], kinds[name], peers, port)
        if targets:
            asked.append(
                (name, targets, netprobe.request(replica, m.node, [t for _, t in targets]))
            )
    pending = [name for name, _, probe in asked if probe.status == InspectionStatus.PENDING]
    if pending:
        raise ProbesPending(f"waiting for the network probes on {', '.join(pending)}")
    findings = []
    for name, targets, probe in asked:
        if probe.status == InspectionStatus.FAILED:
            findings.append(preflight.Finding("net-probe", False, name, probe.error))
            continue
        answers = netprobe.results_by_target(probe)
        for peer, target in targets:
            key = netprobe.target_key(target)
            answer = answers.get(key) or {"ok": False, "detail": "no answer for this target"}
            shown = (
                f"NPU {target['npu']} -> {target['address']}"
                if target["kind"] == "npu-ping"
                else f"{target['address']}:{target['port']}"
            )
            probe_result = preflight.ProbeResult(
                name,
                peer,
                target["kind"],
                shown,
                answer.get("ok") is True,
                answer.get("detail", ""),
            )
            findings += preflight.connectivity_findings([probe_result])
    decision = preflight.blocking(findings, dep.preflight_override)
    if decision.blocked:
        raise PreflightFailed(
            "network probes between the members failed (set preflight_override with a reason "
            "to start anyway): " + "; ".join(decision.reasons)
        )
    if decision.reasons:
        log.warning("replica %s: network probes: %s", replica, decision.record)
        return f"network probes: {decision.record}"
    return f"network probes passed ({len(findings)})" if findings else ""


MAX_SHOWN = 3  # differences named in the reason (state_reason holds 500 characters)


def check_weights(replica: Replica) -> None:
    """Raise WeightsUnconfirmed unless every member's agent read the same model at the
    deployment's path: each manifest is compared with the leader's, and the reason names the
    node and the file. Never waits on an agent: an ask is sent when the transaction commits
    and a later reconcile pass reads the answer (console/deployments/inspection.py)."""
    found = member_manifests(replica)
    (leader, reference), others = found[0], found[1:]
    problems = [p for name, m in others for p in manifest_differences(leader, reference, name, m)]
    if problems:
        shown = "; ".join(problems[:MAX_SHOWN])
        more = f"; and {len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
        raise WeightsUnconfirmed(
            f"the model at {replica.deployment.model_path} is not the same on every member: "
            f"{shown}{more}"
        )


def member_manifests(replica: Replica) -> list[tuple[str, dict]]:
    """(node name, manifest) per member, leader first, from each node's model inspection
    (a fresh answer, or a new ask). Raises WeightsUnconfirmed while one is pending (every
    node is asked in the same pass), refused, or carries no manifest."""
    from console.deployments import inspection

    path = replica.deployment.model_path
    asked = [(m.node.name, inspection.request(m.node, path)) for m in members(replica)]
    pending = [name for name, record in asked if record.status == InspectionStatus.PENDING]
    if pending:
        raise WeightsUnconfirmed(f"waiting for the model inspection on {', '.join(pending)}")
    found = []
    for name, record in asked:
        if record.status == InspectionStatus.FAILED:
            raise WeightsUnconfirmed(f"node {name}: {record.error}")
        manifest = (record.info or {}).get("manifest")
        if not isinstance(manifest, dict):
            raise WeightsUnconfirmed(
                f"node {name}: its agent sends no manifest of the model's files (an older "
                "agent): upgrade it so the members' weights can be compared"
            )
        found.append((name, manifest))
    return found


def manifest_differences(a_name: str, a: dict, b_name: str, b: dict) -> list[str]:
    """What differs between node a's and node b's manifests, one sentence per file (both
    already validated by workers.contracts.WeightsManifest)."""
    if a["scheme"] != b["scheme"]:
        return [
            f"nodes {a_name} and {b_name} checksum differently ({a['scheme']} vs "
            f"{b['scheme']}): run the same agent version on both"
        ]
    if a["digest"] == b["digest"]:
        return []
    files_a = {f["name"]: f for f in a["files"]}
    files_b = {f["name"]: f for f in b["files"]}
    # a list cut at MANIFEST_MAX_FILES says nothing about names past its last one
    cut = [m["files"][-1]["name"] for m in (a, b) if m["files_total"] > len(m["files"])]
    horizon = min(cut) if cut else None
    out = []
    for name in sorted(files_a.keys() | files_b.keys()):
        if horizon is not None and name > horizon:
            break
        fa, fb = files_a.get(name), files_b.get(name)
        if fa is None or fb is None:
            lacking, holding = (a_name, b_name) if fa is None else (b_name, a_name)
            out.append(f"node {lacking}: file {name} is missing (node {holding} has it)")
        elif what := _file_difference(fa, fb):
            out.append(f"node {b_name}: file {name} differs ({what}) from node {a_name}")
    return out or [
        f"node {b_name}: the model's files differ from node {a_name}'s past the "
        f"{len(files_a)} listed"
    ]


def _file_difference(a: dict, b: dict) -> str:
    if a["bytes"] != b["bytes"]:
        return f"size {b['bytes']:,} vs {a['bytes']:,} bytes"
    for key, what in (
        ("sha256", "checksum"),
        ("header_sha256", "safetensors header checksum"),
        ("sample_sha256", "checksum of the sampled bytes"),
    ):
        if a.get(key) != b.get(key):
            return what
    return ""


def is_group(replica: Replica) -> bool:
    return replica.deployment.nodes_per_replica > 1


def members(replica: Replica) -> list[ReplicaMember]:
    return list(replica.members.select_related("node").order_by("rank"))


def fabric(node: Node, device: str) -> str:
    """a3 for Atlas A3 hosts (npu-smi names the chip `Ascend910`, two dies per NPU), a2 for
    the 910B family; cpu for vllm-cpu groups (workers/engine/group.py GroupSpec.fabric)."""
    if device != "npu":
        return "cpu"
    names = {(a.model_name or "").strip() for a in node.accelerators.all()}
    return "a3" if any(n.lower() in ("ascend910", "910_93") for n in names) else "a2"


def _address(node: Node, device: str) -> str:
    """Where this host's group traffic goes: its reported address; vllm-cpu groups (tests and
    demos on one machine) use loopback, as their engines do."""
    if device != "npu":
        return "127.0.0.1"
    if not node.address:
        raise NoNetworkFacts(f"node {node.name} reports no IP address")
    return node.address


def group_spec(replica: Replica, member: ReplicaMember, leader: ReplicaMember) -> GroupSpec:
    """The member's place in the group, from the hosts' own reports (never typed)."""
    dep = replica.deployment
    local = _address(member.node, dep.device)
    interface = interface_of(local, member.node.interfaces or {})
    if interface is None:
        if dep.device != "npu":
            interface = "lo"
        else:
            raise NoNetworkFacts(
                f"node {member.node.name} reports no network interface holding its address "
                f"{local}: HCCL and Gloo would not know where to listen"
            )
    return GroupSpec(
        rank=member.rank,
        size=dep.nodes_per_replica,
        data_parallel_size=dep.data_parallel_size,
        leader_address=_address(leader.node, dep.device),
        rpc_port=replica.rpc_port,
        local_address=local,
        interface=interface,
        fabric=fabric(member.node, dep.device),
    )


def record_member_report(replica: Replica, node: str, report) -> ReplicaMember | None:
    """Keep what a member's agent said (current generation only). None: `node` is not a
    member of this replica."""
    member = replica.members.filter(node__name=node).first()
    if member is None:
        return None
    if report.generation >= member.generation:
        ReplicaMember.objects.filter(pk=member.pk).update(
            generation=report.generation,
            phase=report.phase,
            reason=(report.reason or "")[:500],
            pid=report.pid,
            log_path=report.log_path or member.log_path,
            updated_at=timezone.now(),
        )
        member.generation, member.phase, member.reason = (
            report.generation,
            report.phase,
            report.reason or "",
        )
    return member


def all_stopped(replica: Replica) -> bool:
    """Every member's agent has said its engine ended (a stop for a replica an agent does not
    run is answered `stopped` too, so a member that never started does not hold this up)."""
    return not replica.members.exclude(phase__in=ENDED).exists()


def failed_member(replica: Replica) -> ReplicaMember | None:
    """A member of the current generation whose engine ended without being asked to."""
    return (
        replica.members.select_related("node")
        .filter(
            generation=replica.generation, phase__in=[EnginePhase.FAILED, EnginePhase.CRASH_LOOP]
        )
        .order_by("rank")
        .first()
    )


def recent_failures(replica: Replica) -> int:
    since = timezone.now() - RESTART_WINDOW
    return ReplicaEvent.objects.filter(replica=replica, to_state=S.FAILED, at__gte=since).count()


def restart_due(replica: Replica) -> tuple[bool, str]:
    """(give up?, why) for a failed group; (False, "") while its backoff runs."""
    count = recent_failures(replica)
    if count >= RESTART_MAX:
        return True, (
            f"{count} group failures within {RESTART_WINDOW.seconds // 60} min: not restarting "
            "(every member stopped)"
        )
    delay = backoff_delay(count, BACKOFF_BASE_S, BACKOFF_MAX_S)
    if (timezone.now() - replica.state_changed_at).total_seconds() < delay:
        return False, ""
    return False, f"restarting every member after group failure {count} (backoff {delay:g}s)"


def replicas_with_member_on(node: Node):
    return Replica.objects.filter(Q(node=node) | Q(members__node=node)).distinct()
