"""-t health / board / usages / common / ecc / memory key-value output, and -m mapping."""

from __future__ import annotations

import pytest

from workers.accelerators.ascend import (
    parse_board,
    parse_health,
    parse_key_values,
    parse_npu_smi_map,
    parse_usages,
)
from workers.accelerators.base import ParseError

FAULT_COLLECTION = "npu-smi-fault-collection-910-ecc-board-usages-health-versions.txt"


def section(text: str, command: str) -> str:
    """The output printed under `command` in a multi-command capture."""
    lines = text.splitlines()
    start = lines.index(command) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("/usr/")), len(lines))
    return "\n".join(lines[start:end])


def examples(text: str) -> list[str]:
    """The "# Example output N:" parts of a gpustack docstring capture."""
    return [part.split("\n", 1)[1] for part in text.split("# Example output")[1:]]


# --- -t health ------------------------------------------------------------------------


def test_health_ok_without_error_codes(sample) -> None:
    text = section(sample(FAULT_COLLECTION), "/usr/local/bin/npu-smi info -i 0 -c 0 -t health")
    assert parse_health(text) == [
        {"npu_id": None, "chip_id": None, "health": "OK", "error_codes": [], "error_info": []}
    ]


def test_health_950_uses_health_key(sample) -> None:
    (health,) = parse_health(sample("npu-smi-info-t-health-device-950-doc.txt"))
    assert (health["npu_id"], health["health"], health["error_codes"]) == (0, "OK", [])


def test_health_continuation_lines_join_the_error_information() -> None:
    # No capture with a non-NA error code exists (samples/README A.1): these lines are
    # printed with npu-smi's documented format "\t%-30s : %s\n" instead.
    rows = [
        ("Health Status", "Alarm"),
        ("Error Code", "80E01801 80CB8009"),
        ("Error Information", "first description"),
        ("", "second description"),
    ]
    text = "".join(f"\t{key:<30} : {value}\n" for key, value in rows)  # "\t%-30s : %s\n"
    (health,) = parse_health(text)
    assert health["health"] == "Alarm"
    assert health["error_codes"] == ["80E01801", "80CB8009"]
    assert health["error_info"] == ["first description", "second description"]


def test_output_without_health_line_is_an_error() -> None:
    with pytest.raises(ParseError, match="Health Status"):
        parse_health("\tNPU ID                         : 0\n")


# --- -t board --------------------------------------------------------------------------


def test_board_per_chip_examples(sample) -> None:
    first, second = examples(sample("npu-smi-info-t-board-c-examples.txt"))
    (board,) = parse_board(first)
    assert (board["npu_id"], board["chip_id"], board["chip_type"], board["chip_name"]) == (
        0, 0, "Ascend", "xxx",
    )  # fmt: skip
    assert (board["bus_id"], board["firmware_version"]) == ("0000:81:00.0", "7.1.0.4.218")
    assert board["raw"]["VDie ID"] == "901421D4 02103514 1711E613 6DA7040A 00102001"
    assert board["raw"]["PCB ID"] == "NA"
    (board,) = parse_board(second)
    assert (board["npu_id"], board["firmware_version"], board["raw"]["Board ID"]) == (
        1,
        "7.1.0.4",
        "0x64",
    )


def test_board_950_npu_level(sample) -> None:
    (board,) = parse_board(sample("npu-smi-info-t-board-950-doc.txt"))
    assert (board["npu_id"], board["chip_count"], board["bus_id"]) == (0, 1, "0000:F1:00.0")
    assert (board["product_name"], board["npu_name"], board["chip_id"]) == ("xxx", "xxx", None)
    assert board["raw"]["Main Board ID"] == "0x68(1P)"
    assert board["raw"]["DDie ID"] == "870408E3 2120D518 77936EE6 80B40A0A D4100003"


def test_board_npu_and_chip_variants_of_910(sample) -> None:
    text = sample(FAULT_COLLECTION)
    (npu,) = parse_board(section(text, "/usr/local/bin/npu-smi info -i 0 -t board"))
    assert (npu["software_version"], npu["firmware_version"], npu["chip_count"]) == (
        "23.0.5", "7.1.0.7.220", 1,
    )  # fmt: skip
    (chip,) = parse_board(section(text, "/usr/local/bin/npu-smi info -i 0 -c 0 -t board"))
    assert (chip["chip_id"], chip["chip_name"], chip["bus_id"]) == (0, "xxx", "0000:61:00.0")


# --- -t usages: Chip ID after its block ---------------------------------------------------


def test_usages_chip_id_closes_its_block(sample) -> None:
    first, second = examples(sample("npu-smi-info-t-usages-examples-910-and-310pduo.txt"))
    (usage,) = parse_usages(first)
    assert (usage["npu_id"], usage["chip_id"], usage["ddr_capacity_mb"]) == (0, 0, 15171)
    assert (usage["hbm_capacity_mb"], usage["ddr_usage_percent"], usage["ctrlcpu_percent"]) == (
        32768,
        3,
        9,
    )
    chip0, chip1 = parse_usages(second)
    assert (chip0["npu_id"], chip0["chip_id"], chip0["ddr_capacity_mb"]) == (1, 0, 44280)
    assert (chip1["npu_id"], chip1["chip_id"], chip1["ddr_capacity_mb"]) == (1, 1, 43693)
    assert (chip1["hbm_capacity_mb"], chip1["ddr_bandwidth_percent"], chip1["ctrlcpu_percent"]) == (
        None,
        51,
        3,
    )


def test_usages_of_910_in_fault_collection(sample) -> None:
    text = section(sample(FAULT_COLLECTION), "/usr/local/bin/npu-smi info -i 0 -t usages")
    (usage,) = parse_usages(text)
    assert (usage["npu_id"], usage["chip_id"]) == (0, 0)
    assert (usage["ddr_capacity_mb"], usage["ddr_usage_percent"]) == (13553, 6)
    assert usage["hbm_capacity_mb"] == 32768


def test_usages_with_letters_in_a_number_is_an_error() -> None:
    text = "\tAicore Usage Rate(%)           : lots\n"
    with pytest.raises(ParseError, match="Aicore Usage Rate"):
        parse_usages(text)


# --- -t common / ecc / memory: generic key/value ----------------------------------------


def test_common_chip_id_opens_its_block_and_mcu_is_its_own(sample) -> None:
    first, second = examples(sample("npu-smi-info-t-common-examples-910-and-310p.txt"))
    chip, mcu = parse_key_values(first)
    assert (chip["NPU ID"], chip["Chip ID"], chip["Temperature(C)"], chip["Aicore Count"]) == (
        "0",
        "0",
        "46",
        "32",
    )
    assert (mcu["NPU ID"], mcu["Chip Name"], mcu["NPU Real-time Power(W)"]) == ("0", "mcu", "45.2")
    records = parse_key_values(second)
    assert [(r.get("Chip ID"), r.get("Chip Name")) for r in records] == [
        ("0", None),
        ("1", None),
        (None, "mcu"),
    ]
    assert records[1]["Temperature(C)"] == "59"


def test_ecc_width_40_keys_and_trailing_chip_id(sample) -> None:
    text = section(sample(FAULT_COLLECTION), "/usr/local/bin/npu-smi info -i 0 -t ecc")
    (ecc,) = parse_key_values(text)
    assert (ecc["NPU ID"], ecc["Chip ID"], ecc["Chip Count"]) == ("0", "0", "1")
    assert ecc["HBM Double Bit Aggregate Total Err Cnt"] == "0"
    (ecc950,) = parse_key_values(sample("npu-smi-info-t-ecc-950-doc.txt"))
    assert ecc950["HBM Double Bit Next-Isolated Pages Count"] == "0"


def test_indented_memory_output(sample) -> None:
    text = sample("npu-smi-info-l-and-t-memory-16npu.txt").split("# npu-smi info -t memory")[1]
    (memory,) = parse_key_values(text)
    assert (memory["HBM Capacity(MB)"], memory["HBM Manufacturer ID"]) == ("65536", "0x57")


def test_fault_event_value_with_colons_and_commas(sample) -> None:
    (event,) = parse_key_values(sample("npu-smi-info-t-alarm-950-doc.txt"))
    assert event["Fault Event Information"].startswith("event id=0x81AF8000, severity=2")


def test_no_key_value_lines_is_an_error() -> None:
    with pytest.raises(ParseError, match="no 'key : value' lines"):
        parse_key_values("npu-smi info -t board -i 0\nhttps://example.invalid/x\n")


def test_key_repeated_inside_one_block_names_the_line() -> None:
    text = "\tChip ID                        : 0\n\tChip ID                        : 1\n"
    with pytest.raises(ParseError, match="repeated") as caught:
        parse_key_values(text)
    assert caught.value.line_no == 2


# --- -m -------------------------------------------------------------------------------


def test_map_310_logic_ids_differ_from_npu_id(sample) -> None:
    entries = parse_npu_smi_map(sample("npu-smi-info-m-310-atlas800-3000-v20.2.txt"))
    assert [(e.npu_id, e.chip_id, e.logic_id, e.chip_name) for e in entries] == [
        (215, 0, 0, "MiniD"), (215, 1, 1, "MiniD"), (215, 2, 2, "MiniD"), (215, 3, 3, "MiniD"),
    ]  # fmt: skip


def test_map_mcu_row_has_no_logic_id(sample) -> None:
    entries = parse_npu_smi_map(sample("npu-smi-info-m-310-with-mcu-v21.0.4.txt"))
    assert len(entries) == 5
    mcu = entries[-1]
    assert (mcu.npu_id, mcu.chip_id, mcu.logic_id, mcu.chip_name, mcu.is_mcu) == (
        6,
        4,
        None,
        "Mcu",
        True,
    )
    assert not any(e.is_mcu for e in entries[:-1])


def test_map_chip_name_with_space(sample) -> None:
    entries = parse_npu_smi_map(sample("npu-smi-info-m-910a-8card.txt"))
    assert [(e.npu_id, e.logic_id) for e in entries] == [(n, n) for n in range(8)]
    assert {e.chip_name for e in entries} == {"Ascend 910A"}


def test_map_950_without_logic_id_column(sample) -> None:
    (entry,) = parse_npu_smi_map(sample("npu-smi-info-m-950-doc.txt"))
    assert (entry.npu_id, entry.slot_id, entry.chip_id, entry.phy_id, entry.logic_id) == (
        0,
        0,
        0,
        0,
        None,
    )
    assert entry.chip_name == "xxx"


def test_map_two_tables_two_chips_per_npu(sample) -> None:
    entries = parse_npu_smi_map(sample("npu-smi-info-m-examples-mcu-and-2chip.txt"))
    assert len(entries) == 16 + 12
    second_table = entries[16:]
    assert [(e.npu_id, e.chip_id, e.logic_id) for e in second_table if not e.is_mcu] == [
        (1, 0, 0), (1, 1, 1), (2, 0, 2), (2, 1, 3), (4, 0, 4), (4, 1, 5), (5, 0, 6), (5, 1, 7),
    ]  # fmt: skip


def test_map_row_with_letters_in_logic_id_names_the_line(sample) -> None:
    text = sample("npu-smi-info-m-910a-8card.txt").replace(
        "3                              Ascend", "x  Ascend"
    )
    with pytest.raises(ParseError, match="Chip Logic ID") as caught:
        parse_npu_smi_map(text)
    assert "x  Ascend" in caught.value.line


def test_map_without_table_is_an_error() -> None:
    with pytest.raises(ParseError, match="no npu-smi info -m table"):
        parse_npu_smi_map("dcmi module initialize failed. ret is -8005\n")
