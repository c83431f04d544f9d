"""Preflight of a multi-node group: can these members run one HCCL job across nodes?

Pure functions over facts the console already holds: each member's latest node checks (the
agent's npu-network check carries its NPU IPs and TLS state, workers/accelerators/hccn.py
format_facts), the versions its heartbeat reports (Node.npu_driver_version, cann_version,
software) and the clock skew the console measured (the clock-skew check). facts_for() reads
them for one node; preflight() turns a group's facts into findings; blocking() says whether
the failing ones stop a dispatch. Nothing here writes: recording an override (the audit
entry) is the caller's.

Cross-node NPU ping (`hccn_tool -ping`, A3 `-hccs_ping`) and the reachability of the DP RPC
port need a member to run something against a peer: groups.check_connectivity asks the
members (host.net_probe, workers/netprobe.py) and connectivity_findings() judges the answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from workers.accelerators import hccn

if TYPE_CHECKING:
    from console.inventory.models import Node

MAX_CHECK_AGE = timedelta(minutes=10)  # older checks say little about a link that flaps
MAX_SKEW_S = 1.0  # HCCL jobs and log correlation need clocks within a second (skew fix text)
VERSIONS = (  # (key in MemberFacts.versions, name shown)
    ("npu_driver", "NPU driver"),
    ("cann", "CANN"),
    ("torch_npu", "torch-npu"),
    ("vllm_ascend", "vllm-ascend"),
    ("vllm", "vLLM"),
)
_SKEW = re.compile(r"agent clock is ([+-]?\d+(?:\.\d+)?)s")  # clock_skew_check's evidence
_RUN_CHECKS = "run the node checks again (node page, Run checks)"


@dataclass(frozen=True)
class MemberFacts:
    """One member of a group, as the console knows it."""

    node: str
    checks: Sequence[dict] = ()  # the latest finished run's results: {name, ok, evidence, fix}
    checked_at: datetime | None = None
    versions: dict[str, str | None] = field(default_factory=dict)  # keys of VERSIONS
    clock_skew_s: float | None = None
    npu_ips: dict[int, str] = field(default_factory=dict)  # device -> "10.20.11.11/24"
    vnic_ips: dict[int, str] = field(default_factory=dict)
    tls: str | None = None  # "off", "on", "mixed (…)", "unknown"; None: not reported


@dataclass(frozen=True)
class Finding:
    check: str  # npu-network, clock-skew, tls, npu-ips, versions, npu-ping, port
    ok: bool
    member: str  # node name; "" for a finding about the group as a whole
    evidence: str
    fix: str = ""


def _result(checks: Iterable[dict], name: str) -> dict | None:
    return next((r for r in checks if r.get("name") == name), None)


def member_facts(
    node: str,
    checks: Sequence[dict],
    checked_at: datetime | None,
    versions: dict[str, str | None],
) -> MemberFacts:
    """MemberFacts from a check run's results: network facts from the npu-network evidence,
    the skew from the clock-skew evidence."""
    network = _result(checks, "npu-network")
    facts = hccn.parse_facts(network["evidence"]) if network else hccn.NetworkFacts()
    skew = _result(checks, "clock-skew")
    match = _SKEW.search(skew["evidence"]) if skew else None
    return MemberFacts(
        node=node,
        checks=tuple(checks),
        checked_at=checked_at,
        versions=dict(versions),
        clock_skew_s=float(match[1]) if match else None,
        npu_ips=facts.ips,
        vnic_ips=facts.vnic_ips,
        tls=facts.tls,
    )


def facts_for(node: Node) -> MemberFacts:
    """A node's facts from its latest finished check run and its reported versions (reads
    only: one query for the run)."""
    from console.inventory.models import CheckRunStatus

    run = (
        node.check_runs.filter(status__in=[CheckRunStatus.PASSED, CheckRunStatus.FAILED])
        .order_by("-finished_at")
        .first()
    )
    software = node.software or {}
    versions = {
        "npu_driver": node.npu_driver_version or None,
        "cann": node.cann_version or None,
        "torch_npu": software.get("torch_npu"),
        "vllm_ascend": software.get("vllm_ascend"),
        "vllm": software.get("vllm"),
    }
    if run is None:
        return MemberFacts(node=node.name, versions=versions)
    return member_facts(node.name, run.results, run.finished_at, versions)


def network_finding(m: MemberFacts, now: datetime, max_age: timedelta) -> Finding:
    """The member's npu-network check: present, recent, passing, and run with hccn_tool."""
    result = _result(m.checks, "npu-network")
    if m.checked_at is None or result is None:
        seen = "no finished node checks" if m.checked_at is None else "no npu-network check"
        return Finding(
            "npu-network",
            False,
            m.node,
            seen,
            f"{_RUN_CHECKS}; an agent that does not run npu-network is older than this "
            "console: upgrade it",
        )
    age = now - m.checked_at
    if age > max_age:
        return Finding(
            "npu-network",
            False,
            m.node,
            f"checks are {age.total_seconds() / 60:.0f} min old (limit "
            f"{max_age.total_seconds() / 60:.0f} min)",
            _RUN_CHECKS,
        )
    if result["evidence"] == hccn.NO_TOOL:
        return Finding(
            "npu-network",
            False,
            m.node,
            result["evidence"],
            "mount /usr/local/Ascend/driver into the agent's container (hccn_tool "
            "is driver/tools/hccn_tool) or set HCCN_TOOL_PATH",
        )
    return Finding("npu-network", bool(result["ok"]), m.node, result["evidence"], result["fix"])


def skew_finding(m: MemberFacts, max_skew_s: float) -> Finding:
    if m.clock_skew_s is None:
        return Finding("clock-skew", False, m.node, "no clock-skew measurement", _RUN_CHECKS)
    ok = abs(m.clock_skew_s) <= max_skew_s
    return Finding(
        "clock-skew",
        ok,
        m.node,
        f"{m.clock_skew_s:+.2f}s from the console's clock (limit ±{max_skew_s:g}s)",
        "" if ok else "sync the clock: `chronyc tracking`, then `chronyc makestep`",
    )


def tls_findings(members: Sequence[MemberFacts]) -> list[Finding]:
    """TLS known, the same on every NPU of a member, and the same on every member."""
    fix = "make TLS identical on all NPUs of all members: `hccn_tool -i N -tls -s enable 0`"
    unknown = [m for m in members if m.tls not in ("on", "off")]
    found = [Finding("tls", False, m.node, f"TLS {m.tls or 'not reported'}", fix) for m in unknown]
    states = {m.node: m.tls for m in members if m not in unknown}
    if len(set(states.values())) > 1:
        listed = ", ".join(f"{n}={s}" for n, s in states.items())
        found.append(Finding("tls", False, "", f"TLS differs between members: {listed}", fix))
    elif states and not unknown:
        found.append(Finding("tls", True, "", f"TLS {next(iter(states.values()))} on all"))
    return found


def _bare(ip: str) -> str:
    return ip.split("/", 1)[0]


def npu_ip_findings(members: Sequence[MemberFacts]) -> list[Finding]:
    """Every member reports NPU IPs; no IP is used twice across the group."""
    found = [
        Finding(
            "npu-ips",
            False,
            m.node,
            "no NPU IPs reported (`hccn_tool -i N -ip -g`)",
            "give each NPU an IP: `hccn_tool -i N -ip -s address <ip> netmask <mask>`",
        )
        for m in members
        if not (m.npu_ips or m.vnic_ips)
    ]
    owners: dict[str, list[str]] = {}
    for m in members:
        for kind, ips in (("NPU", m.npu_ips), ("vNIC", m.vnic_ips)):
            for device, ip in ips.items():
                owners.setdefault(_bare(ip), []).append(f"{m.node} {kind} {device}")
    dupes = {ip: where for ip, where in owners.items() if len(where) > 1}
    for ip, where in sorted(dupes.items()):
        found.append(
            Finding(
                "npu-ips",
                False,
                "",
                f"{ip} is used by {', '.join(where)}",
                "NPU IPs must be unique across the group: change one with "
                "`hccn_tool -i N -ip -s address <ip> netmask <mask>`",
            )
        )
    if not found:
        found.append(Finding("npu-ips", True, "", f"{len(owners)} NPU IPs, all unique"))
    return found


def version_findings(members: Sequence[MemberFacts]) -> list[Finding]:
    """Each of VERSIONS reported by every member, and identical."""
    found = []
    for key, shown in VERSIONS:
        seen = {m.node: m.versions.get(key) for m in members}
        listed = ", ".join(f"{n}={v or 'not reported'}" for n, v in seen.items())
        if None in seen.values() or len(set(seen.values())) > 1:
            found.append(
                Finding(
                    "versions",
                    False,
                    "",
                    f"{shown}: {listed}",
                    f"install the same {shown} on every member (one image for the group); "
                    "an agent reports the packages of its own interpreter",
                )
            )
        else:
            found.append(Finding("versions", True, "", f"{shown} {next(iter(seen.values()))}"))
    return found


def preflight(
    members: Sequence[MemberFacts],
    *,
    now: datetime,
    max_check_age: timedelta = MAX_CHECK_AGE,
    max_skew_s: float = MAX_SKEW_S,
) -> list[Finding]:
    """Every finding for a group, passing ones included (so a page can show what was
    verified): per member its npu-network check and clock skew, then TLS, NPU IPs and
    versions across members."""
    found: list[Finding] = []
    for m in members:
        found += [network_finding(m, now, max_check_age), skew_finding(m, max_skew_s)]
    return found + tls_findings(members) + npu_ip_findings(members) + version_findings(members)


@dataclass(frozen=True)
class ProbeResult:
    """A member's answer to "reach this peer": an NPU ping (hccn.ping) or a TCP port
    (workers/netprobe.py port_reachable), as groups.check_connectivity collects them."""

    member: str
    peer: str
    kind: str  # "npu-ping" or "port"
    target: str  # "10.20.11.16" (NPU 3 ->) or "10.0.0.2:13345"
    ok: bool
    detail: str


def connectivity_findings(probes: Iterable[ProbeResult]) -> list[Finding]:
    fixes = {
        "npu-ping": "check both NPUs' link and IP (`hccn_tool -i N -link -g`, `-ip -g`), the "
        "switch VLAN and routes (`hccn_tool -i N -route -g`); A3 vNIC peers use -hccs_ping",
        "port": "open the port between the members (firewall, security group) and check "
        "that the engine on the peer listens on it",
    }
    return [
        Finding(
            p.kind,
            p.ok,
            p.member,
            f"to {p.peer} {p.target}: {p.detail}",
            "" if p.ok else fixes.get(p.kind, ""),
        )
        for p in probes
    ]


@dataclass(frozen=True)
class Decision:
    blocked: bool
    reasons: list[str]  # one line per failing finding
    record: str  # what the caller records (audit entry) when it dispatches; "" when blocked


def _line(f: Finding) -> str:
    return f"{f.member or 'group'}: {f.check}: {f.evidence}"


def blocking(findings: Sequence[Finding], override_reason: str | None = None) -> Decision:
    """Failing findings block a dispatch, unless an operator gives a reason to override
    them: then the dispatch goes ahead and `record` carries the reason and what failed, for
    the caller to record. A blank reason is no reason."""
    reasons = [_line(f) for f in findings if not f.ok]
    if not reasons:
        return Decision(False, [], f"preflight passed ({len(findings)} checks)")
    reason = (override_reason or "").strip()
    if not reason:
        return Decision(True, reasons, "")
    return Decision(
        False, reasons, f"preflight overridden: {reason}. Failing: " + "; ".join(reasons)
    )
