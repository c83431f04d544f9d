"""SimulatedProvider: replays a real `npu-smi info` capture with plausible movement.

For demos and tests on hosts without NPUs. Every result is flagged
extra["simulated"] = True so it can never pass for real hardware.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from .ascend.table import parse_npu_smi_info
from .base import NpuChip, ProviderResult

SAMPLES_DIR = Path(__file__).with_name("samples")
DEFAULT_SAMPLE = SAMPLES_DIR / "npu-smi-info-910b1-v24.1rc3-partial.txt"

# Bounds of the variation, relative to the captured values.
LOAD_STEP = 15.0  # AICore % random-walk step per probe
TEMP_PER_LOAD = 0.25  # °C above the captured value per AICore %
TEMP_RISE_MAX = 30.0
POWER_RISE_MAX = 1.5  # power stays within [0.9, 2.5] × captured power
MEMORY_FILL_MAX = 0.9  # busy chips fill memory up to 90 % of total


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def _vary_used(used: int | None, total: int | None, load: float, rng: random.Random) -> int | None:
    """Memory in use grows with load towards MEMORY_FILL_MAX of total, never past it."""
    if used is None or not total:
        return used
    headroom = max(0.0, MEMORY_FILL_MAX * total - used)
    jitter = rng.uniform(-0.01, 0.01) * total
    return int(_clamp(used + load / 100 * headroom + jitter, 0, total))


class SimulatedProvider:
    """Replays `sample_path` (default: a 910B1 capture shipped with the agent).

    Each probe moves AICore % as a bounded random walk, and memory/HBM used,
    temperature and power with it, within the bounds above; health stays as captured
    unless `health` maps an NPU id to another word. `seed` makes runs repeatable.
    Raises ParseError at construction if the sample cannot be read.
    """

    name = "simulated"

    def __init__(
        self,
        sample_path: str | Path | None = None,
        seed: int | None = None,
        *,
        health: Mapping[int, str] | None = None,
    ) -> None:
        self.sample_path = Path(sample_path) if sample_path else DEFAULT_SAMPLE
        self.report = parse_npu_smi_info(self.sample_path.read_text(encoding="utf-8"))
        self.health = dict(health or {})
        self._rng = random.Random(seed)
        self._load = [self._rng.uniform(0, 30) for _ in self.report.npus]

    def probe(self) -> ProviderResult:
        chips = []
        for index, chip in enumerate(self.report.npus):
            load = _clamp(self._load[index] + self._rng.uniform(-1, 1) * LOAD_STEP, 0, 100)
            self._load[index] = load
            chips.append(self._vary(chip, load))
        return ProviderResult(
            provider=self.name,
            available=True,
            chips=chips,
            processes=[replace(proc) for proc in self.report.processes],
            version=self.report.version,
            extra={"simulated": True, "sample": self.sample_path.name},
        )

    def _vary(self, chip: NpuChip, load: float) -> NpuChip:
        rng = self._rng
        temp = chip.temperature_c
        if temp is not None:
            rise = load * TEMP_PER_LOAD + rng.uniform(-1, 1)
            temp = float(round(_clamp(temp + rise, temp - 1, temp + TEMP_RISE_MAX)))
        power = chip.power_w
        if power is not None:
            factor = 1 + load / 100 * POWER_RISE_MAX + rng.uniform(-0.05, 0.05)
            power = round(power * _clamp(factor, 0.9, 1 + POWER_RISE_MAX), 1)
        return replace(
            chip,
            health=self.health.get(chip.npu_id, chip.health),
            aicore_percent=None if chip.aicore_percent is None else float(round(load)),
            temperature_c=temp,
            power_w=power,
            memory_used_mb=_vary_used(chip.memory_used_mb, chip.memory_total_mb, load, rng),
            hbm_used_mb=_vary_used(chip.hbm_used_mb, chip.hbm_total_mb, load, rng),
        )
