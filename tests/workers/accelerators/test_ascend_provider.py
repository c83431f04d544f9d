"""AscendProvider with stand-in npu-smi scripts: success, -m enrichment, every failure."""

from __future__ import annotations

import time

from workers.accelerators import default_providers, probe_all
from workers.accelerators.ascend import AscendProvider
from workers.accelerators.process import run_tool


def npu_smi_serving(stand_in, tmp_path, info: str, mapping: str | None, map_exit: int = 0):
    (tmp_path / "info.txt").write_text(info)
    if mapping is not None:
        (tmp_path / "map.txt").write_text(mapping)
    return stand_in(
        "npu-smi",
        f'if [ "$2" = "-m" ]; then cat "{tmp_path}/map.txt"; exit {map_exit}; fi\n'
        f'cat "{tmp_path}/info.txt"',
    )


def test_probe_reads_chips_and_logic_ids(stand_in, tmp_path, sample) -> None:
    tool = npu_smi_serving(
        stand_in,
        tmp_path,
        sample("npu-smi-info-310-atlas800-3000-v20.2.txt"),
        sample("npu-smi-info-m-310-atlas800-3000-v20.2.txt"),
    )
    result = AscendProvider(str(tool), timeout=5).probe()
    assert (result.provider, result.available, result.reason, result.version) == (
        "ascend", True, None, "20.2.0",
    )  # fmt: skip
    assert [(c.npu_id, c.chip_id, c.logic_id) for c in result.chips] == [
        (215, 0, 0), (215, 1, 1), (215, 2, 2), (215, 3, 3),
    ]  # fmt: skip


def test_failed_id_mapping_degrades_but_stays_available(stand_in, tmp_path, sample) -> None:
    tool = npu_smi_serving(
        stand_in, tmp_path, sample("npu-smi-info-910b1-v24.1rc3-partial.txt"), "", map_exit=3
    )
    result = AscendProvider(str(tool), timeout=5).probe()
    assert result.available and len(result.chips) == 2
    assert result.reason == "logical ids unknown: npu-smi info -m exited with status 3: no output"
    assert all(c.logic_id is None for c in result.chips)


def test_id_mapping_is_fetched_once(stand_in, tmp_path, sample) -> None:
    tool = npu_smi_serving(
        stand_in,
        tmp_path,
        sample("npu-smi-info-310-atlas800-3000-v20.2.txt"),
        sample("npu-smi-info-m-310-atlas800-3000-v20.2.txt"),
    )
    provider = AscendProvider(str(tool), timeout=5)
    provider.probe()
    (tmp_path / "map.txt").write_text("garbage\n")
    assert [c.logic_id for c in provider.probe().chips] == [0, 1, 2, 3]


def test_missing_binary_is_unavailable(tmp_path) -> None:
    result = AscendProvider(str(tmp_path / "npu-smi")).probe()
    assert not result.available
    assert result.reason == f"npu-smi not found at {tmp_path / 'npu-smi'}"
    assert result.chips == []


def test_timeout_kills_the_tool_and_reports_unavailable(stand_in) -> None:
    tool = stand_in("npu-smi", "sleep 30")
    started = time.monotonic()
    result = AscendProvider(str(tool), timeout=0.5).probe()
    assert time.monotonic() - started < 3
    assert (result.available, result.reason) == (False, "npu-smi timed out after 0.5s")


def test_timeout_does_not_wait_for_children_holding_the_pipes(stand_in) -> None:
    tool = stand_in("npu-smi", "sleep 30 &\nsleep 30 &\nwait")
    started = time.monotonic()
    run = run_tool([str(tool), "info"], timeout=0.3)
    assert time.monotonic() - started < 3
    assert run.error == "npu-smi timed out after 0.3s" and run.returncode is None


def test_nonzero_exit_reports_first_stderr_line(stand_in) -> None:
    tool = stand_in("npu-smi", "echo 'stand-in failure: device busy' >&2\necho more >&2\nexit 8")
    result = AscendProvider(str(tool)).probe()
    assert not result.available
    assert result.reason == "npu-smi info exited with status 8: stand-in failure: device busy"


def test_unreadable_output_is_unavailable_with_the_parse_error(stand_in) -> None:
    tool = stand_in("npu-smi", "echo 'some banner without a table'")
    result = AscendProvider(str(tool)).probe()
    assert not result.available
    assert result.reason == "cannot read npu-smi info output: no npu-smi table found"


def test_probe_all_reports_host_versions_and_each_provider(tmp_path) -> None:
    config = {"npu_smi": str(tmp_path / "npu-smi"), "nvidia_smi": str(tmp_path / "nvidia-smi")}
    found = probe_all(config=config)
    assert list(found) == ["collected_at", "host", "versions", "ascend", "nvidia"]
    assert found["ascend"]["available"] is False and "not found" in found["ascend"]["reason"]
    found = probe_all(simulated=True, config=config)
    assert found["simulated"]["available"] is True
    assert found["simulated"]["extra"]["simulated"] is True


def test_default_providers_follow_agent_config_names() -> None:
    class AgentConfigLike:
        providers = ("simulated", "ascend")
        npu_smi = "/opt/npu-smi"
        npu_smi_timeout_s = 3.0

    simulated, ascend = default_providers(AgentConfigLike())
    assert (simulated.name, ascend.name, ascend.npu_smi, ascend.timeout) == (
        "simulated", "ascend", "/opt/npu-smi", 3.0,
    )  # fmt: skip


def test_unknown_provider_name_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown accelerator provider"):
        default_providers({"providers": ["ascend", "rocm"]})
