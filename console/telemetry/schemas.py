"""API shapes for telemetry; fields listed explicitly."""

from datetime import datetime
from typing import Literal

from ninja import Field, Schema


class ChipLatestOut(Schema):
    npu_id: int
    chip_id: int
    vendor: str | None = None
    name: str | None = None
    health: str | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    aicore_percent: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None
    bus_id: str | None = None
    phy_id: int | None = None
    logic_id: int | None = None


class ProcessOut(Schema):
    npu_id: int
    chip_id: int | None = None
    pid: int
    name: str = ""
    memory_mb: int | None = None


class LatestOut(Schema):
    node: str
    received_at: datetime | None = Field(None, description="console time of the last beat")
    sent_at: datetime | None = Field(None, description="agent time of the last beat")
    age_s: float | None = None
    stale: bool = Field(..., description="no beat within the offline threshold (3 intervals)")
    telemetry_ok: bool | None = None
    telemetry_reason: str | None = None
    chips: list[ChipLatestOut] = []
    processes: list[ProcessOut] = []


class SeriesQuery(Schema):
    node: str = Field(..., description="node name")
    npu_id: int | None = Field(None, ge=0)
    chip_id: int | None = Field(None, ge=0)
    start: datetime | None = Field(None, description="ISO 8601 or Unix seconds; default end-1h")
    end: datetime | None = Field(None, description="ISO 8601 or Unix seconds; default now")
    resolution: str = Field("auto", description="raw, 1m, 1h or auto (≤2h raw, ≤3d 1m, else 1h)")


class ChipSeriesOut(Schema):
    """Column lists of equal length, oldest first. For 1m/1h the plain names are averages."""

    npu_id: int
    chip_id: int
    time: list[float] = Field(..., description="Unix seconds (bucket start for rollups)")
    aicore_percent: list[float | None]
    aicore_percent_max: list[float | None]
    hbm_used_mb: list[float | None]
    hbm_used_mb_max: list[int | None]
    hbm_total_mb: list[int | None]
    temperature_c: list[float | None]
    temperature_c_max: list[float | None]
    power_w: list[float | None]
    health: list[str | None] = Field(..., description="worst in the bucket; null = unreported")
    samples: list[int]


class SeriesOut(Schema):
    node: str
    resolution: Literal["raw", "1m", "1h"]
    step_s: int
    start: datetime
    end: datetime
    truncated: bool = Field(..., description="a series had more points than the cap (newest kept)")
    series: list[ChipSeriesOut]
