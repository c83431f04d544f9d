"""The agent/console contract: what a heartbeat's chip readings may hold."""

from __future__ import annotations

import pytest

from workers.contracts import ChipTelemetry


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("aicore_percent", float("nan")),
        ("temperature_c", float("inf")),
        ("power_w", "-Infinity"),
        ("hbm_used_mb", 10**30),
        ("hbm_total_mb", -1),
        ("memory_used_mb", 2**31),
    ],
)
def test_a_reading_no_npu_reports_becomes_none_and_the_rest_is_kept(field, value):
    chip = ChipTelemetry.model_validate({"npu_id": 3, "health": "OK", field: value})
    assert getattr(chip, field) is None
    assert (chip.npu_id, chip.health) == (3, "OK")


def test_real_readings_pass_unchanged():
    values = {"aicore_percent": 99.5, "temperature_c": -5.0, "hbm_used_mb": 2**31 - 1}
    chip = ChipTelemetry.model_validate({"npu_id": 0, **values, "hbm_total_mb": 0})
    assert chip.model_dump(include=set(values) | {"hbm_total_mb"}) == {**values, "hbm_total_mb": 0}
