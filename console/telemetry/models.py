"""Stored chip telemetry: raw samples (kept hours) and 1-minute / 1-hour rollups (kept days).

The latest values live in Redis (see services); these tables are written only in batches by
the flush and rollup tasks, never per heartbeat.
"""

from __future__ import annotations

from django.db import models

from console.inventory.models import Node


class HealthCode(models.IntegerChoices):
    """npu-smi health as a small number so the worst one is MAX(); NULL = not reported."""

    OK = 0, "OK"
    WARNING = 1, "Warning"
    ALARM = 2, "Alarm"
    CRITICAL = 3, "Critical"


HEALTH_CODES: dict[str, int] = {label.lower(): int(code) for code, label in HealthCode.choices}
HEALTH_LABELS: dict[int, str] = {int(code): str(label) for code, label in HealthCode.choices}


class Resolution(models.IntegerChoices):
    MINUTE = 60, "1m"
    HOUR = 3600, "1h"


class ChipSample(models.Model):
    """One chip's telemetry at one heartbeat (console receive time). Unique per chip and time,
    so a batch written twice is stored once."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    npu_id = models.PositiveSmallIntegerField()
    chip_id = models.PositiveSmallIntegerField(default=0)
    time = models.DateTimeField()
    aicore_percent = models.FloatField(null=True)
    hbm_used_mb = models.IntegerField(null=True)
    hbm_total_mb = models.IntegerField(null=True)
    memory_used_mb = models.IntegerField(null=True)
    memory_total_mb = models.IntegerField(null=True)
    temperature_c = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    health = models.PositiveSmallIntegerField(choices=HealthCode.choices, null=True)

    class Meta:
        constraints = [
            # Also the index of series reads: (node, npu, chip) equal, time range.
            models.UniqueConstraint(
                fields=["node", "npu_id", "chip_id", "time"], name="uniq_sample_per_chip_time"
            ),
        ]
        # Rollup scans and purge deletes go by time across all chips.
        indexes = [models.Index(fields=["time"], name="telemetry_sample_time")]

    def __str__(self) -> str:
        return f"{self.node_id}/npu{self.npu_id}.{self.chip_id} @ {self.time:%Y-%m-%d %H:%M:%S}"


class ChipRollup(models.Model):
    """Aggregates of one chip over one bucket (a minute from raw, an hour from minutes).

    Unique per (node, npu, chip, resolution, bucket): rollups are upserted, so recomputing a
    bucket replaces it.
    """

    resolution = models.PositiveIntegerField(choices=Resolution.choices)
    bucket = models.DateTimeField(help_text="start of the bucket (UTC)")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    npu_id = models.PositiveSmallIntegerField()
    chip_id = models.PositiveSmallIntegerField(default=0)
    aicore_avg = models.FloatField(null=True)
    aicore_max = models.FloatField(null=True)
    hbm_used_avg = models.FloatField(null=True)
    hbm_used_max = models.IntegerField(null=True)
    hbm_total_mb = models.IntegerField(null=True)
    temperature_avg = models.FloatField(null=True)
    temperature_max = models.FloatField(null=True)
    power_avg = models.FloatField(null=True)
    health_worst = models.PositiveSmallIntegerField(choices=HealthCode.choices, null=True)
    samples = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node", "npu_id", "chip_id", "resolution", "bucket"],
                name="uniq_rollup_per_chip_bucket",
            ),
        ]
        # Hourly rollups read a range of minutes fleet-wide; purge deletes old buckets.
        indexes = [models.Index(fields=["resolution", "bucket"], name="telemetry_rollup_bucket")]

    def __str__(self) -> str:
        return f"{self.node_id}/npu{self.npu_id}.{self.chip_id} {self.resolution}s @ {self.bucket}"
