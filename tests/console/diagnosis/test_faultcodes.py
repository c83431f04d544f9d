"""Chip fault codes from Huawei's device-plugin catalogue → handling level and action."""

from __future__ import annotations

import json

import pytest

from console.diagnosis.faultcodes import (
    CATALOGUE,
    LEVEL_ORDER,
    catalogue,
    catalogue_source,
    fault_level,
    levels_table,
)
from tests.console.diagnosis.samples import ASCEND


def test_the_catalogue_copy_is_verbatim_with_its_source_line():
    assert (
        CATALOGUE.read_bytes()
        == (ASCEND / "data-ascend-device-plugin-faultCode.json.txt").read_bytes()
    )
    assert catalogue_source().startswith("github.com/Ascend/ascend-device-plugin @ 0a52c194")
    text = CATALOGUE.read_text()
    raw = json.loads(text[text.index("{") :])
    assert len(catalogue()) == len({c for codes in raw.values() for c in codes}) == 299


@pytest.mark.parametrize(
    ("code", "level"),
    [
        ("80E01801", "RestartBusiness"),  # hex form npu-smi prints
        ("0x8c084e00", "NotHandleFault"),
        ("8C044E00", "RestartNPU"),
        ("80DE1803", "FreeRestartNPU"),
        ("80E3A201", "SeparateNPU"),
        ("8C204E00", "RecoverRestartBusiness"),
        (2349354496, "NotHandleFault"),  # decimal event id = 0x8C084E00
        ("B4060011", "RestartBusiness"),  # listed twice: the more severe level wins
        ("A2301001", "SeparateNPU"),  # listed as RecoverRestartBusiness and SeparateNPU
    ],
)
def test_real_codes_get_their_catalogue_level(code, level):
    result = fault_level(code)
    assert result["level"] == level and result["known"] is True
    assert result["action"]


def test_actions_say_what_to_do_at_each_level():
    assert "npu-smi set -t reset" in fault_level("8C044E00")["action"]
    assert "Isolate" in fault_level("80E3A201")["action"]
    assert "No action" in fault_level("8C084E00")["action"]


def test_an_unknown_code_is_not_guessed():
    # 0x81AF8000 appears in the Ascend 950 npu-smi manual's alarm example, not in this catalogue.
    result = fault_level("0x81AF8000")
    assert result == {"code": "81AF8000", "level": None, "action": result["action"], "known": False}
    assert "not in the catalogue" in result["action"]


def test_a_malformed_code_raises():
    with pytest.raises(ValueError):
        fault_level("not-a-code")
    with pytest.raises(ValueError):
        fault_level("1FFFFFFFF")


def test_levels_table_lists_every_level_most_severe_first():
    table = levels_table()
    assert [row["level"] for row in table] == list(LEVEL_ORDER)
    assert sum(len(row["codes"]) for row in table) == 299
