"""parse_nvidia_csv and NvidiaProvider.

No real nvidia-smi capture is in the shared samples: the text below follows nvidia-smi's
documented `--format=csv,noheader,nounits` output for the queried fields.
"""

from __future__ import annotations

import pytest

from workers.accelerators.base import ParseError
from workers.accelerators.nvidia import NvidiaProvider, parse_nvidia_csv

DOCUMENTED_FORMAT = (
    "0, NVIDIA H100 80GB HBM3, GPU-0b5a8c8e-1111-2222-3333-444455556666, 00000000:18:00.0,"
    " 34, 71.23, 5, 1024, 81559\n"
    "1, Tesla T4, GPU-9f0e1d2c-aaaa-bbbb-cccc-ddddeeeeffff, 00000000:3B:00.0,"
    " 41, [N/A], [Not Supported], 0, 15360\n"
)


def test_rows_become_chips_with_memory_as_hbm() -> None:
    first, second = parse_nvidia_csv(DOCUMENTED_FORMAT)
    assert (first.npu_id, first.chip_id, first.name, first.vendor) == (
        0,
        0,
        "NVIDIA H100 80GB HBM3",
        "nvidia",
    )
    assert (first.temperature_c, first.power_w, first.aicore_percent) == (34, 71.23, 5)
    assert (first.hbm_used_mb, first.hbm_total_mb, first.bus_id) == (
        1024,
        81559,
        "00000000:18:00.0",
    )
    assert first.memory_used_mb is None and first.health is None


def test_not_available_and_not_supported_become_none() -> None:
    second = parse_nvidia_csv(DOCUMENTED_FORMAT)[1]
    assert (second.power_w, second.aicore_percent, second.temperature_c) == (None, None, 41)


def test_wrong_field_count_names_the_line() -> None:
    with pytest.raises(ParseError, match="expected 9 fields, found 3") as caught:
        parse_nvidia_csv(DOCUMENTED_FORMAT + "2, broken, row\n")
    assert caught.value.line_no == 3


def test_letters_in_a_number_field_is_an_error() -> None:
    with pytest.raises(ParseError, match="temperature.gpu"):
        parse_nvidia_csv(DOCUMENTED_FORMAT.replace(" 34,", " hot,"))


def test_empty_output_is_an_error() -> None:
    with pytest.raises(ParseError, match="no nvidia-smi rows"):
        parse_nvidia_csv("\n")


def test_provider_runs_the_query_and_keeps_uuids(stand_in, tmp_path) -> None:
    (tmp_path / "out.csv").write_text(DOCUMENTED_FORMAT)
    tool = stand_in(
        "nvidia-smi",
        'case "$1" in --query-gpu=index,name,uuid,pci.bus_id,temperature.gpu,power.draw,'
        "utilization.gpu,memory.used,memory.total) ;; *) exit 9;; esac\n"
        f'[ "$2" = "--format=csv,noheader,nounits" ] || exit 9\ncat "{tmp_path}/out.csv"',
    )
    result = NvidiaProvider(str(tool), timeout=5).probe()
    assert result.available and [c.npu_id for c in result.chips] == [0, 1]
    assert result.extra["uuids"]["1"] == "GPU-9f0e1d2c-aaaa-bbbb-cccc-ddddeeeeffff"


def test_provider_without_driver_is_unavailable(stand_in, tmp_path) -> None:
    tool = stand_in("nvidia-smi", "echo 'stand-in: driver not loaded'\nexit 9")
    result = NvidiaProvider(str(tool)).probe()
    assert (result.available, result.reason) == (
        False,
        "nvidia-smi exited with status 9: stand-in: driver not loaded",
    )
    assert not NvidiaProvider(str(tmp_path / "absent")).probe().available
