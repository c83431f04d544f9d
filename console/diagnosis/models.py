"""Incidents: a failure the console saw (engine crash, sick or hot NPU), with its diagnosis.

Repeats of the same failure fold into one open incident (same `fingerprint`, not resolved):
`count` goes up and `last_seen` moves. A resolved incident is never reopened — a recurrence
opens a new one. Incidents outlive the replica restarts that follow them.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class IncidentStatus(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


class Severity(models.TextChoices):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


SEVERITY_RANK = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


class Incident(models.Model):
    category = models.CharField(max_length=64, db_index=True)
    severity = models.CharField(max_length=16, choices=Severity.choices, default=Severity.WARNING)
    title = models.CharField(max_length=300)
    status = models.CharField(
        max_length=16, choices=IncidentStatus.choices, default=IncidentStatus.OPEN, db_index=True
    )
    fingerprint = models.CharField(max_length=200, db_index=True)
    count = models.PositiveIntegerField(default=1)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now, db_index=True)
    replica = models.ForeignKey(
        "deployments.Replica", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    node = models.ForeignKey(
        "inventory.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    accelerator = models.ForeignKey(
        "inventory.Accelerator",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="incidents",
    )
    # the NPUs a failing replica (or multi-host member) held when it failed: the NPU journal
    # lists the incident after the chips were released (`accelerator` is a chip fault's own)
    accelerators = models.ManyToManyField(
        "inventory.Accelerator", blank=True, related_name="engine_incidents"
    )
    subject = models.CharField(max_length=200, blank=True, help_text="what failed, in words")
    diagnoses = models.JSONField(default=list, blank=True)  # Diagnosis.as_dict(), best first
    evidence = models.JSONField(default=list, blank=True)  # [{line, rule, context:[{n,text,hit}]}]
    telemetry = models.JSONField(null=True, blank=True)  # the node's latest chips when opened
    acknowledged_by = models.CharField(max_length=150, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen", "-id"]
        constraints = [
            # At most one unresolved incident per fingerprint: the fold target.
            models.UniqueConstraint(
                fields=["fingerprint"],
                condition=~Q(status="resolved"),
                name="uniq_unresolved_incident_fingerprint",
            )
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    @property
    def severity_rank(self) -> int:
        return SEVERITY_RANK.get(self.severity, 3)

    @property
    def is_resolved(self) -> bool:
        return self.status == IncidentStatus.RESOLVED


class NoteKind(models.TextChoices):
    NOTE = "note"  # an operator's words
    SYSTEM = "system"  # the console's own ("no rule matched", "crash-loop: …")
    REPEAT = "repeat"  # a folded repeat: the failure was seen again
    ACTION = "action"  # acknowledged, resolved


class IncidentNote(models.Model):
    """One entry of an incident's timeline (the page lists them in order)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="notes")
    kind = models.CharField(max_length=16, choices=NoteKind.choices, default=NoteKind.NOTE)
    author = models.CharField(max_length=150)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    text = models.TextField()
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"note on #{self.incident_id} by {self.author}"


# --- incident webhooks (console/diagnosis/webhooks.py) --------------------------------------
class WebhookEndpoint(models.Model):
    """Where incident events are POSTed, signed with this endpoint's own secret.

    `url` and `secret` are secrets (a Slack/Feishu/DingTalk hook URL embeds its token): shown
    as scheme + host and `***` (webhook_services.shown_url), never logged, never audited.
    """

    name = models.CharField(max_length=100, unique=True)
    url = models.CharField(max_length=2000)
    secret = models.CharField(max_length=200)
    enabled = models.BooleanField(default=True)
    min_severity = models.CharField(
        max_length=16, choices=Severity.choices, default=Severity.WARNING
    )
    renotify_minutes = models.PositiveIntegerField(
        default=30, help_text="a folded repeat pages again only after this long; 0 = every time"
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_delivery_at = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)  # HTTP status
    last_error = models.CharField(max_length=200, blank=True)  # "timed out" — never the URL
    last_event = models.CharField(max_length=16, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"webhook {self.name}"

    def wants(self, severity: str) -> bool:
        """Whether an incident of `severity` reaches this endpoint (min_severity or worse)."""
        return SEVERITY_RANK.get(severity, 3) <= SEVERITY_RANK.get(self.min_severity, 2)


class WebhookNotice(models.Model):
    """When an endpoint was last told about an incident, and the count it was told: folded
    repeats inside the endpoint's re-notify interval send nothing (webhooks.dispatch)."""

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="+")
    endpoint_key = models.CharField(max_length=32)  # a WebhookEndpoint pk, or "env"
    sent_at = models.DateTimeField()
    count = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["incident", "endpoint_key"], name="uniq_webhook_notice")
        ]

    def __str__(self) -> str:
        return f"notice of #{self.incident_id} to {self.endpoint_key}"
