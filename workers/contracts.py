"""The contract between the console and the host agents: task names and payloads.

Imported by both halves; standard library + pydantic only (no Django). A payload that does not
validate is refused by the receiving side, never half-applied.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

CONSOLE_QUEUE = "console"
AGENT_VERSION = "0.1.0"


def host_queue(node_name: str) -> str:
    """The queue a node's agent consumes."""
    return f"host.{node_name}"


class Tasks:
    """Task names. console.* run on the console worker, host.* on a node's agent."""

    PING = "console.ping"
    HEARTBEAT = "console.heartbeat"
    CHECK_RESULTS = "console.check_results"
    HOST_PING = "host.ping"
    HOST_RUN_CHECKS = "host.run_checks"


class ChipTelemetry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    npu_id: int
    chip_id: int = 0
    vendor: str = "huawei"
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


class ProcessInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    npu_id: int
    chip_id: int | None = None
    pid: int
    name: str = ""
    memory_mb: int | None = None


class Heartbeat(BaseModel):
    """What an agent sends every interval (host.<node> -> queue `console`)."""

    model_config = ConfigDict(extra="ignore")

    node: str = Field(..., pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    enroll_token: str = Field(..., min_length=8, max_length=200)
    sent_at: datetime
    seq: int = 0
    agent_version: str = AGENT_VERSION
    interval_s: float = 5.0
    simulated: bool = False
    host: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str | None] = Field(default_factory=dict)
    chips: list[ChipTelemetry] = Field(default_factory=list)
    processes: list[ProcessInfo] = Field(default_factory=list)
    telemetry_ok: bool = True
    telemetry_reason: str | None = None
    engines: list[dict[str, Any]] = Field(default_factory=list)


class CheckResult(BaseModel):
    """One node check: pass/fail, the evidence seen, and the fix when it fails."""

    name: str
    ok: bool
    evidence: str = ""
    fix: str = ""
