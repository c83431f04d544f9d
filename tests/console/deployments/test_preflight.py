"""Multi-node preflight: findings from the members' real check results, and the block/override
decision. Check results are produced by the agent's own check (fed real hccn_tool outputs)
and the console's clock-skew check, so the facts format is tested end to end."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from console.deployments import preflight
from console.deployments.preflight import Finding, MemberFacts, ProbeResult
from console.inventory.checks import ClockOffset, clock_skew_check
from console.inventory.models import CheckRunStatus, NodeCheckRun
from tests.factories import make_node
from tests.workers.hccn_support import FakeHccn, fixture, healthy_outputs
from workers import checks
from workers.accelerators import hccn
from workers.accelerators.base import NpuChip, ProviderResult

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
VERSIONS = {
    "npu_driver": "25.2.0",
    "cann": "8.3.RC2",
    "torch_npu": "2.7.1.post1",
    "vllm_ascend": "0.11.0",
    "vllm": "0.11.0",
}
A2 = ProviderResult(
    provider="ascend",
    available=True,
    chips=[NpuChip(npu_id=i, chip_id=0, name="910B3", logic_id=i, phy_id=i) for i in range(2)],
)


def network_check(first_ip: int, overrides: dict | None = None) -> dict:
    per_device = {
        (d, "-ip"): f"ipaddr:10.20.11.{first_ip + d}\nnetmask:255.255.255.0\n" for d in range(2)
    }
    per_device.update(overrides or {})
    runner = FakeHccn(healthy_outputs(), per_device)
    return checks.check_npu_network(A2, "hccn_tool", runner=runner).model_dump()


def skew_check(agent_ahead_s: float) -> dict:
    return clock_skew_check(ClockOffset(agent_ahead_s, 0.001, 0.002)).model_dump()


def member(
    node: str, first_ip: int, *, skew: float = 0.1, overrides=None, **changes
) -> MemberFacts:
    results = [network_check(first_ip, overrides), skew_check(skew)]
    facts = preflight.member_facts(node, results, NOW - timedelta(minutes=2), VERSIONS)
    return replace(facts, **changes)


def failing(findings: list[Finding]) -> list[tuple[str, str, str]]:
    return [(f.check, f.member, f.evidence) for f in findings if not f.ok]


def test_member_facts_read_back_what_the_checks_wrote() -> None:
    facts = member("a", 11, skew=0.25)
    assert facts.npu_ips == {0: "10.20.11.11/24", 1: "10.20.11.12/24"}
    assert (facts.tls, facts.clock_skew_s) == ("off", 0.25)


def test_a_ready_group_has_only_passing_findings() -> None:
    findings = preflight.preflight([member("a", 11), member("b", 21)], now=NOW)
    assert failing(findings) == []
    assert {f.check for f in findings} == {
        "npu-network",
        "clock-skew",
        "tls",
        "npu-ips",
        "versions",
    }
    assert "4 NPU IPs, all unique" in [f.evidence for f in findings]
    decision = preflight.blocking(findings)
    assert (decision.blocked, decision.reasons) == (False, [])
    assert decision.record == f"preflight passed ({len(findings)} checks)"


def test_tls_must_be_the_same_on_every_member() -> None:
    on = fixture("tls-mismatch-2npu-hccl-doc.txt").replace("switch[0]", "switch[1]")
    b = member("b", 21, overrides={(0, "-tls"): on, (1, "-tls"): on})
    assert failing(preflight.tls_findings([member("a", 11), b])) == [
        ("tls", "", "TLS differs between members: a=off, b=on")
    ]


def test_tls_mixed_within_a_member_or_unknown_fails_for_that_member() -> None:
    mixed = member("b", 21, overrides={(1, "-tls"): fixture("tls-mismatch-2npu-hccl-doc.txt")})
    found = failing(preflight.tls_findings([member("a", 11), mixed, member("c", 31, tls=None)]))
    assert found == [("tls", "b", "TLS mixed (0=off 1=on)"), ("tls", "c", "TLS not reported")]


def test_npu_ips_must_be_unique_across_members() -> None:
    found = failing(preflight.npu_ip_findings([member("a", 11), member("b", 12)]))
    assert found == [("npu-ips", "", "10.20.11.12 is used by a NPU 1, b NPU 0")]
    bare = failing(preflight.npu_ip_findings([member("a", 11), member("c", 31, npu_ips={})]))
    assert bare == [("npu-ips", "c", "no NPU IPs reported (`hccn_tool -i N -ip -g`)")]


def test_versions_must_match_and_be_reported() -> None:
    b = member("b", 21, versions={**VERSIONS, "torch_npu": "2.7.1", "vllm": None})
    found = failing(preflight.version_findings([member("a", 11), b]))
    assert found == [
        ("versions", "", "torch-npu: a=2.7.1.post1, b=2.7.1"),
        ("versions", "", "vLLM: a=0.11.0, b=not reported"),
    ]


def test_a_failing_stale_or_missing_network_check_fails_the_member() -> None:
    down = member("a", 11, overrides={(1, "-link"): fixture("link-down-910b-gpustack-test.txt")})
    stale = member("b", 21, checked_at=NOW - timedelta(minutes=30))
    never = MemberFacts("c", versions=VERSIONS)
    skipped = {"name": "npu-network", "ok": True, "evidence": hccn.NO_TOOL, "fix": ""}
    no_tool = member("d", 41, checks=(skipped,))
    found = [preflight.network_finding(m, NOW, preflight.MAX_CHECK_AGE) for m in (down, stale)]
    found += [preflight.network_finding(m, NOW, preflight.MAX_CHECK_AGE) for m in (never, no_tool)]
    assert [f.ok for f in found] == [False] * 4
    assert found[0].evidence.startswith("NPU 1: link DOWN. NPU IPs: 0=10.20.11.11/24")
    assert "-optical -g" in found[0].fix
    assert found[1].evidence == "checks are 30 min old (limit 10 min)"
    assert found[2].evidence == "no finished node checks"
    assert "HCCN_TOOL_PATH" in found[3].fix


def test_clock_skew_over_the_limit_or_unmeasured_fails() -> None:
    assert preflight.skew_finding(member("a", 11, skew=-1.5), 1.0).evidence == (
        "-1.50s from the console's clock (limit ±1s)"
    )
    assert not preflight.skew_finding(member("a", 11, skew=-1.5), 1.0).ok
    assert not preflight.skew_finding(member("a", 11, clock_skew_s=None), 1.0).ok
    assert preflight.skew_finding(member("a", 11, skew=0.9), 1.0).ok


def test_failing_findings_block_unless_overridden_with_a_reason() -> None:
    findings = preflight.preflight([member("a", 11), member("b", 12)], now=NOW)
    blocked = preflight.blocking(findings, override_reason="   ")
    assert blocked.blocked and blocked.record == ""
    assert blocked.reasons == ["group: npu-ips: 10.20.11.12 is used by a NPU 1, b NPU 0"]
    allowed = preflight.blocking(findings, override_reason="b's NPU 0 is not used by this job")
    assert not allowed.blocked and allowed.reasons == blocked.reasons
    assert allowed.record == (
        "preflight overridden: b's NPU 0 is not used by this job. "
        "Failing: group: npu-ips: 10.20.11.12 is used by a NPU 1, b NPU 0"
    )


def test_connectivity_answers_become_findings() -> None:
    lost = hccn.parse_ping(fixture("ping-loss-mindie-doc.txt"))
    probes = [
        ProbeResult("a", "b", "npu-ping", "10.10.100.10", lost.ok, lost.detail),
        ProbeResult("a", "b", "port", "10.0.0.2:13345", True, "10.0.0.2:13345 open (1 ms)"),
    ]
    ping, port = preflight.connectivity_findings(probes)
    assert (ping.ok, ping.evidence) == (
        False,
        "to b 10.10.100.10: 2/3 replies, 33.33% loss, 1 failed",
    )
    assert "-route -g" in ping.fix
    assert port.ok and port.fix == ""


@pytest.mark.django_db
def test_facts_for_a_node_read_its_latest_finished_run() -> None:
    node = make_node(
        "m1",
        npu_driver_version="25.2.0",
        cann_version="8.3.RC2",
        software={"torch_npu": "2.7.1.post1", "vllm_ascend": "0.11.0", "vllm": "0.11.0"},
    )
    assert preflight.facts_for(node) == MemberFacts("m1", versions=VERSIONS)
    NodeCheckRun.objects.create(
        node=node,
        status=CheckRunStatus.PASSED,
        finished_at=NOW - timedelta(hours=2),
        results=[network_check(51), skew_check(3.0)],
    )
    latest = NodeCheckRun.objects.create(
        node=node,
        status=CheckRunStatus.FAILED,
        finished_at=NOW - timedelta(minutes=1),
        results=[network_check(11), skew_check(0.2)],
    )
    NodeCheckRun.objects.create(node=node)  # pending: no answer yet
    facts = preflight.facts_for(node)
    assert (facts.checked_at, facts.clock_skew_s) == (latest.finished_at, 0.2)
    assert facts.npu_ips == {0: "10.20.11.11/24", 1: "10.20.11.12/24"}
    assert facts.versions == VERSIONS
