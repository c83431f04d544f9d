"""parse_npu_smi_info fails loudly on unreadable tables and drops only a cut-off tail."""

from __future__ import annotations

import pytest

from workers.accelerators.ascend import parse_npu_smi_info
from workers.accelerators.base import ParseError

COMPLETE = "npu-smi-info-910a-8card-named-910B-v24.1.0.txt"


def line_no_of(text: str, needle: str) -> int:
    (found,) = [no for no, line in enumerate(text.splitlines(), 1) if needle in line]
    return found


def test_letters_in_the_temp_column_name_the_line(sample) -> None:
    text = sample(COMPLETE).replace("| 66.9        34  ", "| 66.9        3a  ")
    with pytest.raises(ParseError) as caught:
        parse_npu_smi_info(text)
    assert caught.value.line_no == line_no_of(text, "| 66.9        3a")
    assert "Temp(C)" in str(caught.value) and "'3a'" in str(caught.value)
    assert "66.9" in caught.value.line
    assert "\n" not in str(caught.value)


def test_row_missing_a_cell_names_the_line(sample) -> None:
    text = sample(COMPLETE).replace(
        "| 4     910B                | OK            |", "| 4     910B  |"
    )
    with pytest.raises(ParseError, match="expected 3 cells, found 2") as caught:
        parse_npu_smi_info(text)
    assert caught.value.line_no == line_no_of(text, "| 4     910B  |")


def test_row_missing_a_value_names_the_line(sample) -> None:
    text = sample(COMPLETE).replace("2904 / 13553      3    / 32768", "2904 / 13553              ")
    with pytest.raises(ParseError, match="has 2 values") as caught:
        parse_npu_smi_info(text)
    assert caught.value.line_no == line_no_of(text, "2904 / 13553   ")


def test_row_cut_short_in_the_middle_is_an_error(sample) -> None:
    lines = sample(COMPLETE).splitlines()
    index = next(i for i, line in enumerate(lines) if "0000:41:00.0" in line)
    lines[index] = lines[index][:40]
    with pytest.raises(ParseError, match="cut off") as caught:
        parse_npu_smi_info("\n".join(lines))
    assert caught.value.line_no == index + 1


def test_chip_with_one_line_in_the_middle_is_an_error(sample) -> None:
    text = "\n".join(line for line in sample(COMPLETE).splitlines() if "0000:81:00.0" not in line)
    with pytest.raises(ParseError, match="expected 2 lines per chip, found 1"):
        parse_npu_smi_info(text)


def test_text_between_a_row_and_its_border_is_an_error(sample) -> None:
    row = "0000:C2:00.0  | 0           2904 / 13553      3    / 32768         |"
    text = sample(COMPLETE).replace(row, row + "\ngarbage")
    with pytest.raises(ParseError, match="not followed by a border") as caught:
        parse_npu_smi_info(text)
    assert "0000:C2:00.0" in caught.value.line


def test_non_number_in_a_usage_pair_is_an_error(sample) -> None:
    text = sample(COMPLETE).replace("1694 / 15665", "1694 / 15x65")
    with pytest.raises(ParseError, match="HBM-Usage|Memory-Usage|values"):
        parse_npu_smi_info(text)


@pytest.mark.parametrize(
    "text", ["", "\n\n", "# source: nothing\n", "bash: npu-smi: command not found\n"]
)
def test_no_table_at_all_is_an_error(text: str) -> None:
    with pytest.raises(ParseError, match="no npu-smi table found") as caught:
        parse_npu_smi_info(text)
    assert caught.value.line_no is None


def test_unrelated_log_is_not_a_table(sample) -> None:
    with pytest.raises(ParseError, match="no npu-smi table found"):
        parse_npu_smi_info(sample("dmesg-ascend-monitor-heartbeat-lost-health-warning.txt"))


def test_input_cut_inside_the_header_names_the_line(sample) -> None:
    lines = sample(COMPLETE).splitlines()
    header = next(i for i, line in enumerate(lines) if "Health" in line)
    with pytest.raises(ParseError, match="expected 2 header lines") as caught:
        parse_npu_smi_info("\n".join(lines[: header + 1]))
    assert caught.value.line_no == header + 1


def test_input_cut_before_the_first_complete_chip_is_an_error(sample) -> None:
    lines = sample(COMPLETE).splitlines()
    first_row = next(i for i, line in enumerate(lines) if "0000:C1:00.0" in line)
    with pytest.raises(ParseError, match="without a complete chip row"):
        parse_npu_smi_info("\n".join(lines[:first_row]) + "\n| 0         ")


def test_every_cut_inside_the_last_chip_drops_only_that_chip(sample) -> None:
    text = sample(COMPLETE)
    start = text.index("| 7     910B")
    end = text.index("|", text.index("0000:02:00.0") + 40)  # closing bar of the last row 2
    for cut in range(start, end):
        report = parse_npu_smi_info(text[:cut])
        assert [c.npu_id for c in report.npus] == list(range(7)), repr(text[start:cut])
    assert len(parse_npu_smi_info(text[: end + 1]).npus) == 8


def test_cut_inside_the_process_table_keeps_the_complete_rows(sample) -> None:
    text = sample("npu-smi-info-910-atlas800-9010-v24.1rc2-warning-procs.txt")
    cut = text.index("| 3       0            | 37659 ") + 30
    report = parse_npu_smi_info(text[:cut])
    assert len(report.npus) == 8
    assert [p.pid for p in report.processes][-2:] == [37643, 37651]


def test_process_row_with_a_non_numeric_pid_is_an_error(sample) -> None:
    text = sample("npu-smi-info-910-atlas800-9010-v24.1rc2-warning-procs.txt")
    text = text.replace("| 37664   ", "| 3766x   ")
    with pytest.raises(ParseError, match="Process id") as caught:
        parse_npu_smi_info(text)
    assert "3766x" in caught.value.line


def test_header_without_npu_column_is_an_error(sample) -> None:
    text = sample(COMPLETE).replace("| NPU   Name ", "| XPU   Name ")
    with pytest.raises(ParseError, match="no NPU column"):
        parse_npu_smi_info(text)


def test_headerless_rows_of_no_known_layout_are_an_error() -> None:
    text = "| 0  a | b |\n| 1  c | d |\n+----+\n"
    with pytest.raises(ParseError, match="fits no known layout") as caught:
        parse_npu_smi_info(text)
    assert caught.value.line_no == 1


def test_excerpt_starting_inside_a_chip_drops_only_that_chip(sample) -> None:
    text = sample("npu-smi-info-a3-tp8dp2-phyid-12-15-partial.txt")
    starts_at_row_2 = "\n".join(line for line in text.splitlines() if "172.9" not in line)
    report = parse_npu_smi_info(starts_at_row_2)
    assert [(c.npu_id, c.chip_id) for c in report.npus] == [(6, 1), (7, 0), (7, 1)]


def test_health_word_with_a_space_is_kept_whole(sample) -> None:
    # Not an observed value: checks that the Health cell is read whole.
    text = sample(COMPLETE).replace(
        "| 5     910B                | OK      ", "| 5     910B                | Not OK  "
    )
    report = parse_npu_smi_info(text)
    assert [c.health for c in report.npus if c.npu_id == 5] == ["Not OK"]
