"""The npu-network and hccn-conf node checks, fed real hccn_tool outputs by a fake runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.hccn_support import FakeHccn, fixture, healthy_outputs
from workers import checks
from workers.accelerators import hccn
from workers.accelerators.base import NpuChip, ProviderResult
from workers.accelerators.process import ToolRun
from workers.config import AgentConfig


def a2(n: int = 8) -> ProviderResult:
    chips = [NpuChip(npu_id=i, chip_id=0, name="910B3", phy_id=i, logic_id=i) for i in range(n)]
    return ProviderResult(provider="ascend", available=True, chips=chips)


def a3(n_npus: int = 2) -> ProviderResult:
    chips = [
        NpuChip(npu_id=i, chip_id=c, name="Ascend910", phy_id=2 * i + c, logic_id=2 * i + c)
        for i in range(n_npus)
        for c in (0, 1)
    ]
    return ProviderResult(provider="ascend", available=True, chips=chips)


def ip_of(device: int) -> str:
    return f"ipaddr:10.20.11.{11 + device}\nnetmask:255.255.255.0\n"


def fake(overrides: dict[tuple[int, str], str] | None = None, devices: int = 8) -> FakeHccn:
    per_device = {(d, "-ip"): ip_of(d) for d in range(devices)}
    per_device.update(overrides or {})
    return FakeHccn(healthy_outputs(), per_device)


# --- npu-network ----------------------------------------------------------------------------


def test_without_hccn_tool_the_check_passes_and_says_why() -> None:
    result = checks.check_npu_network(a2(), None)
    assert (result.ok, result.evidence) == (True, hccn.NO_TOOL)


def test_all_npus_up_and_healthy_with_their_ips_and_tls() -> None:
    result = checks.check_npu_network(a2(), "hccn_tool", runner=fake())
    assert result.ok and result.fix == ""
    assert result.evidence.startswith(
        "8 NPUs: link UP, net health Success. NPU IPs: 0=10.20.11.11/24"
    )
    assert result.evidence.endswith("7=10.20.11.18/24. Gateway: 192.168.6.1 on all. TLS: off.")
    facts = hccn.parse_facts(result.evidence)
    assert facts.ips[7] == "10.20.11.18/24" and facts.tls == "off" and facts.vnic_ips == {}


def test_a_down_link_and_a_faulty_npu_are_named_with_the_fix() -> None:
    runner = fake(
        {
            (2, "-link"): fixture("link-down-910b-gpustack-test.txt"),
            (2, "-net_health"): fixture("net-health-fault-elastic-training-doc.txt"),
            (5, "-net_health"): fixture("net-health-socket-failed-910a-capture.txt"),
        }
    )
    result = checks.check_npu_network(a2(), "hccn_tool", runner=runner)
    assert not result.ok
    assert result.evidence.startswith(
        "NPU 2: link DOWN, net health Fault; NPU 5: net health Socket failed. NPU IPs:"
    )
    assert "-optical -g" in result.fix and "-cfg recovery" in result.fix


def test_tls_differing_between_npus_fails() -> None:
    runner = fake({(1, "-tls"): fixture("tls-mismatch-2npu-hccl-doc.txt")}, devices=2)
    result = checks.check_npu_network(a2(2), "hccn_tool", runner=runner)
    assert not result.ok
    assert result.evidence.startswith("TLS differs between NPUs: 0=off 1=on.")
    assert "-tls -s enable 0" in result.fix


def test_a3_reads_the_vnic_too() -> None:
    runner = fake(devices=4)
    result = checks.check_npu_network(a3(), "hccn_tool", runner=runner)
    assert result.ok
    assert "vNIC IPs: 0=192.168.2.199/24" in result.evidence
    assert {c[3] for c in runner.calls} >= {"-vnic"}
    down = fake({(3, "-vnic"): fixture("vnic-950-doc.txt").replace("UP", "DOWN")}, devices=4)
    assert checks.check_npu_network(a3(), "hccn_tool", runner=down).evidence.startswith(
        "NPU 3: vNIC DOWN."
    )


def test_a2_does_not_ask_for_a_vnic() -> None:
    runner = fake()
    checks.check_npu_network(a2(), "hccn_tool", runner=runner)
    assert "-vnic" not in {c[3] for c in runner.calls}


def test_a_hanging_tool_is_one_failure_not_a_long_wait() -> None:
    def hang(argv, timeout):
        return ToolRun(" ".join(argv), None, error="hccn_tool timed out after 10s")

    result = checks.check_npu_network(a2(), "hccn_tool", runner=hang)
    assert (result.ok, result.evidence) == (False, "hccn_tool timed out after 10s")
    assert "/usr/local/Ascend/driver" in result.fix


def test_no_npus_listed_fails_and_points_at_npu_smi() -> None:
    empty = ProviderResult(provider="ascend", available=False, reason="npu-smi not found")
    result = checks.check_npu_network(empty, "hccn_tool", runner=fake())
    assert not result.ok and "npu-smi" in result.fix


def test_device_ids_are_logical_ids_or_positions() -> None:
    chips = [NpuChip(npu_id=215, chip_id=i, logic_id=i) for i in range(4)]
    assert checks.npu_devices(chips) == [0, 1, 2, 3]
    assert checks.npu_devices([NpuChip(npu_id=6, chip_id=0), NpuChip(npu_id=7, chip_id=0)]) == [
        0,
        1,
    ]


# --- hccn-conf --------------------------------------------------------------------------------


def with_conf(tmp_path: Path, text: str) -> str:
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc" / "hccn.conf").write_text(text)
    return str(tmp_path)


def test_hccn_conf_of_eight_npus_passes(tmp_path) -> None:
    root = with_conf(tmp_path, fixture("hccn-conf-8npu-notes.txt"))
    result = checks.check_hccn_conf(a2(), "hccn_tool", root)
    assert (result.ok, result.evidence) == (
        True,
        "8 addresses in 10.20.11.0/24, one per NPU, unique",
    )


def test_hccn_conf_missing_npus_are_named(tmp_path) -> None:
    root = with_conf(tmp_path, fixture("hccn-conf-910b1-arthurchiao-blog.txt"))
    result = checks.check_hccn_conf(a2(), "hccn_tool", root)
    assert not result.ok and result.evidence == "no address_N for NPU 1, 2, 3, 4, 5, 6"
    alone = checks.check_hccn_conf(ProviderResult("ascend", False), "hccn_tool", root)
    assert alone.ok and alone.evidence == "2 addresses in 29.1.0.0/16, one per NPU, unique"


def test_hccn_conf_duplicates_subnets_and_gateways(tmp_path) -> None:
    text = fixture("hccn-conf-8npu-notes.txt")
    text = text.replace("address_3=10.20.11.14", "address_3=10.20.11.12")
    text = text.replace("address_7=10.20.11.18", "address_7=10.20.12.18")
    text += "gateway_0=10.20.99.1\n"
    result = checks.check_hccn_conf(a2(), "hccn_tool", with_conf(tmp_path, text))
    assert not result.ok
    assert result.evidence == (
        "gateway_0=10.20.99.1 is outside 10.20.11.0/24; "
        "10.20.11.12 is used by address_1, address_3; "
        "addresses span 10.20.11.0/24, 10.20.12.0/24"
    )
    assert "-ip -s address" in result.fix


def test_hccn_conf_absent(tmp_path) -> None:
    skipped = checks.check_hccn_conf(a2(), None, str(tmp_path))
    assert (skipped.ok, skipped.evidence) == (True, hccn.NO_TOOL)
    missing = checks.check_hccn_conf(a2(), "hccn_tool", str(tmp_path))
    assert not missing.ok and missing.evidence.startswith("/etc/hccn.conf: ")
    assert "-v /etc/hccn.conf:/etc/hccn.conf" in missing.fix


def test_hccn_conf_without_addresses_fails(tmp_path) -> None:
    result = checks.check_hccn_conf(ProviderResult("ascend", False), "t", with_conf(tmp_path, "\n"))
    assert (result.ok, result.evidence) == (False, "no address_N lines")


# --- run_checks -----------------------------------------------------------------------------


@pytest.fixture
def no_hccn_tool(monkeypatch):
    monkeypatch.setattr(hccn, "HCCN_TOOL_FALLBACK", "/nonexistent/hccn_tool")


def test_run_checks_on_a_host_without_hccn_tool_stays_green(tmp_path, no_hccn_tool) -> None:
    config = AgentConfig(
        node_name="n1", broker_url="redis://x", enroll_token="", state_dir=tmp_path,
        hccn_tool=str(tmp_path / "no-hccn-tool"),
    )  # fmt: skip
    results = {r.name: r for r in checks.run_checks(config, a2(), root=str(tmp_path))}
    assert results["npu-network"].ok and results["hccn-conf"].ok
    assert results["npu-network"].evidence == hccn.NO_TOOL


def test_hccn_tool_path_comes_from_the_environment() -> None:
    env = {"NPU_AGENT_BROKER_URL": "redis://x", "HCCN_TOOL_PATH": "/opt/hccn_tool"}
    assert AgentConfig.from_env(env).hccn_tool == "/opt/hccn_tool"
    assert AgentConfig.from_env({"NPU_AGENT_BROKER_URL": "redis://x"}).hccn_tool == "hccn_tool"


def test_npu_network_with_a_real_stand_in_tool(stand_in, tmp_path) -> None:
    for option, text in healthy_outputs().items():
        (tmp_path / f"{option.lstrip('-')}.txt").write_text(text)
    tool = stand_in("hccn_tool", f'cat "{tmp_path}/$(echo "$3" | tr -d -).txt"')
    result = checks.check_npu_network(a2(4), str(tool), timeout=5)
    assert result.ok and result.evidence.startswith("4 NPUs: link UP, net health Success.")
    assert "NPU IPs: 0=29.1.112.213/16" in result.evidence
