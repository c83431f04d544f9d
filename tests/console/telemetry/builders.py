"""Builders for telemetry tests: heartbeats, chips, stored samples and rollups."""

from __future__ import annotations

from datetime import UTC, datetime

from console.telemetry.models import ChipRollup, ChipSample
from workers.contracts import Heartbeat

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC)


def chip(npu_id: int, chip_id: int = 0, **fields) -> dict:
    values = {
        "npu_id": npu_id,
        "chip_id": chip_id,
        "name": "910B3",
        "health": "OK",
        "power_w": 90.5,
        "temperature_c": 41.0,
        "aicore_percent": 37.5,
        "memory_used_mb": 2_000,
        "memory_total_mb": 15_000,
        "hbm_used_mb": 32_768,
        "hbm_total_mb": 65_536,
        "bus_id": f"0000:{0xC1 + npu_id:02X}:00.0",
        "phy_id": npu_id,
        "logic_id": npu_id,
    }
    values.update(fields)
    return values


def heartbeat(node: str, chips: list[dict], *, sent_at: datetime = T0, **extra) -> Heartbeat:
    payload = {
        "node": node,
        "enroll_token": "enroll-token-xyz",
        "sent_at": sent_at.isoformat(),
        "host": {"hostname": f"{node}.dc"},
        "chips": chips,
        "processes": [{"npu_id": 0, "chip_id": 0, "pid": 4242, "name": "vllm", "memory_mb": 30}],
        **extra,
    }
    return Heartbeat.model_validate(payload)


def sample(node, time: datetime, npu_id: int = 0, chip_id: int = 0, **fields) -> ChipSample:
    values = {
        "aicore_percent": 10.0,
        "hbm_used_mb": 1_000,
        "hbm_total_mb": 65_536,
        "temperature_c": 40.0,
        "power_w": 100.0,
        "health": 0,
    }
    values.update(fields)
    return ChipSample.objects.create(node=node, npu_id=npu_id, chip_id=chip_id, time=time, **values)


def rollup(node, resolution: int, bucket: datetime, npu_id: int = 0, **fields) -> ChipRollup:
    values = {
        "aicore_avg": 20.0,
        "aicore_max": 30.0,
        "hbm_used_avg": 1_500.0,
        "hbm_used_max": 2_000,
        "hbm_total_mb": 65_536,
        "temperature_avg": 45.0,
        "temperature_max": 50.0,
        "power_avg": 120.0,
        "health_worst": 0,
        "samples": 12,
    }
    values.update(fields)
    return ChipRollup.objects.create(
        node=node, resolution=resolution, bucket=bucket, npu_id=npu_id, chip_id=0, **values
    )
