"""A benchmark run: a load test against a deployment's ready replicas, with its results."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from console.deployments.models import Deployment


class RunStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


R = RunStatus
# The one table of allowed run transitions; terminal states have none.
RUN_TRANSITIONS: dict[str, set[str]] = {
    R.QUEUED: {R.RUNNING, R.CANCELLED, R.FAILED},
    R.RUNNING: {R.SUCCEEDED, R.FAILED, R.CANCELLED},
    R.SUCCEEDED: set(),
    R.FAILED: set(),
    R.CANCELLED: set(),
}
ACTIVE = [R.QUEUED, R.RUNNING]
# (field, label, unit, True when higher is better) — the numbers a run is judged by.
METRICS = [
    ("req_per_s", "Requests/s", "req/s", True),
    ("output_tokens_per_s", "Output tokens/s", "tok/s", True),
    ("ttft_p50_ms", "TTFT p50", "ms", False),
    ("ttft_p99_ms", "TTFT p99", "ms", False),
    ("itl_p50_ms", "ITL p50", "ms", False),
    ("itl_p99_ms", "ITL p99", "ms", False),
    ("e2e_p50_ms", "E2E latency p50", "ms", False),
    ("e2e_p99_ms", "E2E latency p99", "ms", False),
    ("errors", "Errors", "", False),
]


class BenchmarkRun(models.Model):
    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="benchmark_runs"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="last progress write; a stale one means a lost worker"
    )
    # what was asked
    prompt_tokens = models.PositiveIntegerField()
    output_tokens = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField(null=True, blank=True)
    request_rate = models.FloatField(null=True, blank=True, help_text="requests/s, Poisson")
    duration_s = models.PositiveIntegerField()
    max_requests = models.PositiveIntegerField(null=True, blank=True)
    seed = models.PositiveIntegerField(null=True, blank=True)
    client = models.CharField(max_length=40, default="built-in (httpx)")
    # where it stands
    status = models.CharField(max_length=10, choices=RunStatus.choices, default=R.QUEUED)
    reason = models.CharField(max_length=500, blank=True)
    requests = models.PositiveIntegerField(default=0, help_text="finished without error")
    errors = models.PositiveIntegerField(default=0)
    unfinished = models.PositiveIntegerField(default=0, help_text="cut off by cancel or drain")
    in_flight = models.PositiveIntegerField(default=0)
    elapsed_s = models.FloatField(default=0)
    # results (set when the run ends)
    duration_measured_s = models.FloatField(null=True, blank=True)
    req_per_s = models.FloatField(null=True, blank=True)
    output_tokens_per_s = models.FloatField(null=True, blank=True)
    output_tokens_total = models.PositiveBigIntegerField(null=True, blank=True)
    prompt_tokens_mean = models.FloatField(null=True, blank=True, help_text="as the engine counted")
    ttft_p50_ms = models.FloatField(null=True, blank=True)
    ttft_p99_ms = models.FloatField(null=True, blank=True)
    itl_p50_ms = models.FloatField(null=True, blank=True)
    itl_p99_ms = models.FloatField(null=True, blank=True)
    e2e_p50_ms = models.FloatField(null=True, blank=True)
    e2e_p99_ms = models.FloatField(null=True, blank=True)
    error_samples = models.JSONField(default=list, blank=True)
    timeline = models.JSONField(default=dict, blank=True, help_text="per-second columns")
    engine_settings = models.JSONField(
        default=dict, blank=True, help_text="the deployment's spec when the run started"
    )
    targets = models.JSONField(default=list, blank=True, help_text="the replicas it loaded")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "heartbeat_at"])]

    def __str__(self) -> str:
        return f"benchmark #{self.pk} of {self.deployment_id}"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    @property
    def load(self) -> str:
        """The load shape in words, e.g. 'concurrency 8' or '2.5 req/s'."""
        if self.concurrency:
            return f"concurrency {self.concurrency}"
        return f"{self.request_rate:g} req/s"

    @property
    def progress_pct(self) -> int:
        if self.status not in ACTIVE:
            return 100
        return min(99, int(100 * self.elapsed_s / max(1, self.duration_s)))
