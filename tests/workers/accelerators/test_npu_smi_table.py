"""parse_npu_smi_info on every real capture, with exact values per layout family."""

from __future__ import annotations

import re
from pathlib import Path

from workers.accelerators.ascend import parse_npu_smi_info
from workers.accelerators.base import NpuChip, NpuSmiReport

# A complete second chip line ends with a PCI bus id cell and the closing bar: counted
# independently of the parser to check that no complete chip is lost or invented.
_COMPLETE_ROW2 = re.compile(r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|.*\|\s*$")
_BANNER = re.compile(r"Version:\s*(\S+)")


def chip(report: NpuSmiReport, npu_id: int, chip_id: int = 0) -> NpuChip:
    (found,) = [c for c in report.npus if (c.npu_id, c.chip_id) == (npu_id, chip_id)]
    return found


def test_every_table_sample_parses_to_its_complete_chips(table_sample: Path) -> None:
    text = table_sample.read_text(encoding="utf-8")
    report = parse_npu_smi_info(text)
    complete_rows = sum(bool(_COMPLETE_ROW2.search(line)) for line in text.splitlines())
    assert len(report.npus) == complete_rows
    banner = _BANNER.search(text)
    assert report.version == (banner[1] if banner else None)
    for c in report.npus:
        assert c.health in {"OK", "Warning", "Alarm", "Critical", "UNKNOWN"}
        assert c.vendor == "huawei"
        assert c.temperature_c is not None and 0 < c.temperature_c < 120
        assert c.memory_used_mb is not None and c.memory_total_mb is not None
        assert c.memory_used_mb <= c.memory_total_mb
        if c.hbm_total_mb is not None:
            assert c.hbm_used_mb is not None and c.hbm_used_mb <= c.hbm_total_mb
        assert c.bus_id and re.fullmatch(r"[0-9A-F]{4}:[0-9A-F]{2}:[0-9A-F]{2}\.\d", c.bus_id)


def test_report_json_has_exactly_the_documented_shape(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-910-atlas800-9010-v24.1rc2-warning-procs.txt"))
    data = report.to_json()
    assert list(data) == ["version", "npus", "processes"]
    assert list(data["npus"][0]) == [
        "npu_id", "chip_id", "name", "health", "power_w", "temperature_c",
        "aicore_percent", "memory_used_mb", "memory_total_mb", "hbm_used_mb",
        "hbm_total_mb", "bus_id",
    ]  # fmt: skip
    assert list(data["processes"][0]) == ["npu_id", "chip_id", "pid", "name", "memory_mb"]
    assert "container_pid" in report.to_dict()["processes"][0]


# --- 310 / 310P / 300I Duo: no HBM column, row 2 is "chip device" -----------------------


def test_310_v20_has_npu_id_215_four_chips_and_no_hugepages(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-310-atlas800-3000-v20.2.txt"))
    assert report.version == "20.2.0"
    assert [(c.npu_id, c.chip_id, c.device_id) for c in report.npus] == [
        (215, 0, 0), (215, 1, 1), (215, 2, 2), (215, 3, 3),
    ]  # fmt: skip
    assert [c.temperature_c for c in report.npus] == [56, 57, 57, 55]
    assert [c.bus_id for c in report.npus] == [
        "0000:DA:00.0", "0000:DC:00.0", "0000:DD:00.0", "0000:DB:00.0",
    ]  # fmt: skip
    first = report.npus[0]
    assert (first.name, first.health, first.power_w, first.aicore_percent) == ("310", "OK", 12.8, 0)
    assert (first.memory_used_mb, first.memory_total_mb) == (2703, 8192)
    assert first.hbm_used_mb is first.hbm_total_mb is None
    assert first.hugepages_used is first.hugepages_total is None


def test_310_single_reads_hugepages_and_empty_process_table(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-310-single-with-proc-table-v23.0.0.txt"))
    assert report.version == "23.0.0"
    c = chip(report, 0)
    assert (c.power_w, c.temperature_c, c.hugepages_used, c.hugepages_total) == (12.8, 61, 0, 969)
    assert (c.memory_used_mb, c.memory_total_mb, c.bus_id) == (577, 7759, "0000:01:00.0")
    assert report.processes == []


def test_310p3_na_power_is_none_and_npu_id_6(sample) -> None:
    text = sample("npu-smi-info-310p3-single-with-proc-table-v25.3rc1.txt")
    report = parse_npu_smi_info(text)
    assert report.version == "25.3.rc1"
    c = chip(report, 6)
    assert (c.name, c.health, c.power_w, c.temperature_c) == ("310P3", "OK", None, 50)
    assert (c.memory_used_mb, c.memory_total_mb, c.bus_id) == (1839, 21525, "0000:84:00.0")
    assert (c.device_id, c.hbm_total_mb) == (0, None)
    assert report.processes == []


def test_310p3_two_cards_without_banner(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-310p3-2card-partial.txt"))
    assert report.version is None
    assert [(c.npu_id, c.chip_id, c.device_id) for c in report.npus] == [(0, 0, 0), (1, 0, 1)]
    second = chip(report, 1)
    assert (second.power_w, second.temperature_c, second.bus_id) == (15.4, 43, "0000:89:00.0")
    assert (second.memory_used_mb, second.memory_total_mb) == (1070, 21534)


def test_300i_duo_two_chips_per_npu_and_cut_tail_dropped(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-300i-duo-310p3-v25.0rc1-partial.txt"))
    assert report.version == "25.0.rc1.b033"
    assert [(c.npu_id, c.chip_id, c.device_id) for c in report.npus] == [(1, 0, 0), (1, 1, 1)]
    assert (chip(report, 1, 0).memory_used_mb, chip(report, 1, 0).memory_total_mb) == (1607, 47304)
    assert (chip(report, 1, 1).memory_used_mb, chip(report, 1, 1).memory_total_mb) == (1379, 46717)
    assert [c.power_w for c in report.npus] == [None, None]


def test_300i_duo_busy_used_value_touching_the_slash(sample) -> None:
    text = sample("npu-smi-info-300i-duo-310p3-busy-hugepages-v25.5.0-partial.txt")
    report = parse_npu_smi_info(text)
    assert report.version == "25.5.0"
    (c,) = report.npus  # the second chip's row 2 is cut after "| 1       1"
    assert (c.memory_used_mb, c.memory_total_mb) == (37623, 44278)
    assert (c.hugepages_used, c.hugepages_total, c.temperature_c) == (18047, 18047, 58)


def test_300i_duo_npu_2_chips(sample) -> None:
    text = sample("npu-smi-info-300i-duo-310p3-v25.2.0-waiting-engine-partial.txt")
    report = parse_npu_smi_info(text)
    assert [(c.npu_id, c.chip_id, c.temperature_c) for c in report.npus] == [(2, 0, 70), (2, 1, 69)]
    assert chip(report, 2, 1).memory_used_mb == 1516


# --- 910 / 910A / 910B: DDR and HBM, row 2 is "chip" ------------------------------------


def test_910_warning_health_and_process_rows(sample) -> None:
    text = sample("npu-smi-info-910-atlas800-9010-v24.1rc2-warning-procs.txt")
    report = parse_npu_smi_info(text)
    assert report.version == "24.1.RC2"
    assert [c.npu_id for c in report.npus] == list(range(8))
    assert [c.npu_id for c in report.npus if c.health == "Warning"] == [3, 7]
    c = chip(report, 3)
    assert (c.name, c.power_w, c.temperature_c, c.bus_id) == ("xxx", 206.9, 39, "0000:01:00.0")
    assert (c.memory_used_mb, c.memory_total_mb, c.hbm_used_mb, c.hbm_total_mb) == (
        3616,
        15039,
        0,
        32768,
    )
    assert (c.hugepages_used, c.hugepages_total) == (1232, 1232)
    assert chip(report, 7).power_w == 203.2
    assert len(report.processes) == 32
    first, last = report.processes[0], report.processes[-1]
    assert (first.npu_id, first.chip_id, first.pid, first.name, first.memory_mb) == (
        0, 0, 37656, "hlt_host_devmm_", 686,
    )  # fmt: skip
    assert first.container_pid is None
    assert (last.npu_id, last.pid) == (7, 37663)
    assert {p.npu_id for p in report.processes} == set(range(8))


def test_910a_named_910b_with_32g_hbm(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-910a-8card-named-910B-v24.1.0.txt"))
    assert report.version == "24.1.0"
    assert len(report.npus) == 8 and {c.name for c in report.npus} == {"910B"}
    c0, c3 = chip(report, 0), chip(report, 3)
    assert (c0.power_w, c0.memory_used_mb, c0.memory_total_mb, c0.hbm_used_mb) == (
        70.0,
        1197,
        13553,
        1365,
    )
    assert (c3.power_w, c3.temperature_c, c3.memory_total_mb, c3.hbm_used_mb) == (
        67.2,
        33,
        15567,
        3,
    )
    assert {c.hbm_total_mb for c in report.npus} == {32768}


def test_910b1_partial_keeps_two_complete_npus(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-910b1-v24.1rc3-partial.txt"))
    assert report.version == "24.1.rc3"
    assert [c.npu_id for c in report.npus] == [0, 1]
    c = chip(report, 1)
    assert (c.name, c.power_w, c.temperature_c, c.aicore_percent) == ("910B1", 97.8, 48, 0)
    assert (c.memory_used_mb, c.memory_total_mb, c.hbm_used_mb, c.hbm_total_mb) == (
        0,
        0,
        3367,
        65536,
    )
    assert c.bus_id == "0000:01:00.0"


def test_910b2_busy_hbm_five_digits(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-910b2-busy-59891-v24.1.0-partial.txt"))
    (c,) = report.npus
    assert (c.name, c.power_w, c.temperature_c, c.hbm_used_mb, c.hbm_total_mb) == (
        "910B2", 99.6, 37, 59891, 65536,
    )  # fmt: skip


def test_910b2c_drops_row_cut_inside_hbm_value(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-910b2c-v25.0rc1.1-partial.txt"))
    assert report.version == "25.0.rc1.1"
    (c,) = report.npus
    assert (c.npu_id, c.name, c.power_w, c.hbm_used_mb, c.bus_id) == (
        0,
        "910B2C",
        89.1,
        51722,
        "0000:5A:00.0",
    )


def test_910b3_excerpt_starting_at_second_header_line(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-910b3-4of8-partial.txt"))
    assert report.version is None
    assert [c.npu_id for c in report.npus] == [0, 1, 2, 3]
    c = chip(report, 2)
    assert (c.power_w, c.temperature_c, c.hbm_used_mb, c.bus_id) == (
        102.7,
        51,
        3360,
        "0000:C2:00.0",
    )


def test_910b4_headerless_single_npu(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-910b4-single.txt"))
    (c,) = report.npus
    assert (c.npu_id, c.name, c.power_w, c.temperature_c) == (2, "910B4", 88.9, 39)
    assert (c.hbm_used_mb, c.hbm_total_mb, c.bus_id) == (2858, 32768, "0000:C2:00.0")


# --- A3: two dies per NPU, Phy-ID, second die power "-" ---------------------------------


def test_a3_second_die_power_is_none(sample) -> None:
    text = sample("npu-smi-info-a3-ascend910-2chip-per-npu-v24.1rc3.7-partial.txt")
    report = parse_npu_smi_info(text)
    assert report.version == "24.1.rc3.7"
    first, second = chip(report, 0, 0), chip(report, 0, 1)
    assert (first.name, first.phy_id, first.power_w, first.temperature_c) == (
        "Ascend910",
        0,
        175.0,
        39,
    )
    assert (second.phy_id, second.power_w, second.temperature_c) == (1, None, 38)
    assert (second.hbm_used_mb, second.hbm_total_mb, second.bus_id) == (3215, 65536, "0000:9F:00.0")
    assert (second.memory_used_mb, second.memory_total_mb) == (0, 0)


def test_a3_complete_rows_at_end_of_input_are_kept(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-a3-ascend910-2chip-v25.2.1-partial.txt"))
    assert report.version == "25.2.1"
    assert [(c.npu_id, c.chip_id, c.phy_id) for c in report.npus] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 2),
    ]
    c = chip(report, 1, 0)
    assert (c.power_w, c.temperature_c, c.hbm_used_mb, c.bus_id) == (
        168.1,
        37,
        3125,
        "0000:99:00.0",
    )


def test_a3_headerless_excerpt_reads_phy_ids_12_to_15(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-a3-tp8dp2-phyid-12-15-partial.txt"))
    assert [(c.npu_id, c.chip_id, c.phy_id) for c in report.npus] == [
        (6, 0, 12), (6, 1, 13), (7, 0, 14), (7, 1, 15),
    ]  # fmt: skip
    assert (chip(report, 6, 0).power_w, chip(report, 6, 0).hbm_used_mb) == (172.9, 3104)
    assert chip(report, 7, 1).power_w is None
    assert report.processes == []  # the process header is cut off


def test_wide_26_layout_reads_like_the_narrow_one(sample) -> None:
    text = sample("npu-smi-info-a3-ascend910-v26.0rc2-wide-layout-partial.txt")
    assert max(len(line) for line in text.splitlines()[2:]) == 116  # wider than 24.x/25.x
    report = parse_npu_smi_info(text)
    assert report.version == "26.0.rc2"
    first, second = chip(report, 0, 0), chip(report, 0, 1)
    assert (first.power_w, first.temperature_c, first.hbm_used_mb, first.phy_id) == (
        162.6,
        34,
        3419,
        0,
    )
    assert (second.power_w, second.hbm_used_mb, second.bus_id) == (None, 2874, "0000:9F:00.0")


def test_process_id_in_container_column(sample) -> None:
    text = sample("npu-smi-info-a3-v26.0rc2-proc-table-container-col-partial.txt")
    report = parse_npu_smi_info(text)
    (c,) = report.npus
    assert (c.npu_id, c.chip_id, c.phy_id, c.hbm_used_mb, c.hbm_total_mb) == (
        7,
        1,
        15,
        31877,
        65536,
    )
    (proc,) = report.processes
    assert (proc.npu_id, proc.chip_id, proc.pid, proc.name, proc.memory_mb) == (
        0,
        0,
        632268,
        "python3.1",
        197,
    )
    assert proc.container_pid is None  # printed as NA


# --- Ascend 950: "NPU ID" cell, empty row-2 left cells, NPU Util ------------------------


def test_950_npu_id_header_and_npu_util(sample) -> None:
    report = parse_npu_smi_info(sample("npu-smi-info-950-doc-basic.txt"))
    assert report.version == "x.x.x"
    (c,) = report.npus
    assert (c.npu_id, c.chip_id, c.name, c.health, c.power_w, c.temperature_c) == (
        0,
        0,
        "xxx",
        "OK",
        204.4,
        56,
    )
    assert (c.aicore_percent, c.hbm_used_mb, c.hbm_total_mb, c.bus_id) == (
        0,
        4439,
        86016,
        "0000:91:00.0",
    )
    assert report.processes == []


def test_text_between_table_blocks_is_skipped(sample) -> None:
    # Huawei's fault-collection doc elides NPUs 1-6 with "..." lines.
    text = sample("npu-smi-fault-collection-910-ecc-board-usages-health-versions.txt")
    report = parse_npu_smi_info(text)
    assert report.version == "23.0.5"
    assert [(c.npu_id, c.bus_id, c.memory_used_mb) for c in report.npus] == [
        (0, "0000:61:00.0", 920), (7, "0000:3D:00.0", 2346),
    ]  # fmt: skip


def test_indented_crlf_paste_reads_the_same(sample) -> None:
    text = sample("npu-smi-info-910-atlas800-9010-v24.1rc2-warning-procs.txt")
    pasted = "\r\n".join("    " + line for line in text.splitlines())
    assert parse_npu_smi_info(pasted) == parse_npu_smi_info(text)


def test_name_with_a_space_is_kept_whole(sample) -> None:
    # samples/README A.1 lists "Ascend 910A" among the Name column values.
    text = sample("npu-smi-info-910a-8card-named-910B-v24.1.0.txt")
    report = parse_npu_smi_info(text.replace("| 0     910B       ", "| 0     Ascend 910A"))
    assert chip(report, 0).name == "Ascend 910A"
    assert chip(report, 1).name == "910B"
