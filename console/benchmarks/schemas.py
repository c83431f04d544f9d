"""API shapes for benchmark runs; fields listed explicitly, ranges checked here (422 + field)."""

from datetime import datetime

from ninja import Field, Schema

from console.schemas import StrictIn


class BenchmarkIn(StrictIn):
    prompt_tokens: int = Field(256, ge=1, le=131_072, description="about this many tokens")
    output_tokens: int = Field(128, ge=1, le=32_768, description="exactly (ignore_eos)")
    concurrency: int | None = Field(None, ge=1, le=1024, description="closed loop: users")
    request_rate: float | None = Field(
        None, gt=0, le=10_000, description="open loop: Poisson arrivals per second"
    )
    duration_s: int = Field(60, ge=1, le=3600, description="stop sending after this")
    max_requests: int | None = Field(None, ge=1, le=1_000_000)
    seed: int | None = Field(None, ge=0, le=2_147_483_647)


class BenchmarkOut(Schema):
    id: int
    deployment: str = Field(..., alias="deployment.name")
    created_by: str | None = Field(None, alias="created_by.username")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    status: str
    reason: str
    client: str
    prompt_tokens: int
    output_tokens: int
    concurrency: int | None
    request_rate: float | None
    duration_s: int
    max_requests: int | None
    seed: int | None
    requests: int
    errors: int
    unfinished: int
    in_flight: int
    elapsed_s: float
    duration_measured_s: float | None
    req_per_s: float | None
    output_tokens_per_s: float | None
    output_tokens_total: int | None
    prompt_tokens_mean: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    error_samples: list[str]
    engine_settings: dict
    targets: list[dict]


class BenchmarkDetailOut(BenchmarkOut):
    timeline: dict


class MetricDelta(Schema):
    key: str
    label: str
    unit: str
    a: float | None
    b: float | None
    delta: float | None
    delta_pct: float | None
    better: bool | None


class SettingDiff(Schema):
    key: str
    a: object = None
    b: object = None


class CompareOut(Schema):
    a: BenchmarkOut
    b: BenchmarkOut
    metrics: list[MetricDelta]
    settings_diff: list[SettingDiff]
    params_diff: list[SettingDiff]
