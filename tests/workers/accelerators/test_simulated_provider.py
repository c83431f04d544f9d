"""SimulatedProvider: replays real captures, moves within bounds, always flagged."""

from __future__ import annotations

import pytest

from workers.accelerators.ascend import parse_npu_smi_info
from workers.accelerators.base import ParseError
from workers.accelerators.simulated import (
    DEFAULT_SAMPLE,
    POWER_RISE_MAX,
    SAMPLES_DIR,
    TEMP_RISE_MAX,
    SimulatedProvider,
)


def test_bundled_samples_are_verbatim_captures_with_their_source(sample) -> None:
    bundled = sorted(SAMPLES_DIR.glob("npu-smi-info-*.txt"))
    assert DEFAULT_SAMPLE in bundled and len(bundled) >= 2
    for path in bundled:
        text = path.read_text(encoding="utf-8")
        assert text.startswith("# source: ")
        assert text == sample(path.name)
        assert parse_npu_smi_info(text).npus


def test_default_replays_the_910b_capture_flagged_simulated() -> None:
    result = SimulatedProvider(seed=1).probe()
    assert (result.provider, result.available, result.version) == ("simulated", True, "24.1.rc3")
    assert result.extra == {"simulated": True, "sample": DEFAULT_SAMPLE.name}
    assert [(c.npu_id, c.name, c.hbm_total_mb) for c in result.chips] == [
        (0, "910B1", 65536), (1, "910B1", 65536),
    ]  # fmt: skip


@pytest.mark.parametrize("name", [p.name for p in sorted(SAMPLES_DIR.glob("npu-smi-info-*.txt"))])
def test_values_stay_within_bounds_over_many_probes(name: str) -> None:
    provider = SimulatedProvider(SAMPLES_DIR / name, seed=7)
    base = {(c.npu_id, c.chip_id): c for c in provider.report.npus}
    seen_aicore = set()
    for _ in range(500):
        for chip in provider.probe().chips:
            orig = base[(chip.npu_id, chip.chip_id)]
            assert chip.health == orig.health and chip.bus_id == orig.bus_id
            assert 0 <= chip.aicore_percent <= 100
            seen_aicore.add(chip.aicore_percent)
            assert (
                orig.temperature_c - 1 <= chip.temperature_c <= orig.temperature_c + TEMP_RISE_MAX
            )
            if orig.power_w is None:
                assert chip.power_w is None  # A3 second die, 310P "NA" stay unreported
            else:
                assert 0.9 * orig.power_w - 0.05 <= chip.power_w
                assert chip.power_w <= (1 + POWER_RISE_MAX) * orig.power_w + 0.05
            for used, total in (
                (chip.hbm_used_mb, chip.hbm_total_mb),
                (chip.memory_used_mb, chip.memory_total_mb),
            ):
                if total is not None:
                    assert 0 <= used <= total
            assert (chip.hbm_total_mb, chip.memory_total_mb) == (
                orig.hbm_total_mb,
                orig.memory_total_mb,
            )
    assert len(seen_aicore) > 20  # it really moves


def test_same_seed_same_sequence() -> None:
    first, second = SimulatedProvider(seed=3), SimulatedProvider(seed=3)
    for _ in range(5):
        assert first.probe().chips == second.probe().chips


def test_health_changes_only_when_configured() -> None:
    result = SimulatedProvider(seed=1, health={1: "Alarm"}).probe()
    assert [c.health for c in result.chips] == ["OK", "Alarm"]


def test_unreadable_sample_fails_at_construction(tmp_path) -> None:
    path = tmp_path / "broken.txt"
    path.write_text("not a table\n")
    with pytest.raises(ParseError):
        SimulatedProvider(path)
