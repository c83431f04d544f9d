"""Engine log lines shipped from the hosts: one row per line, numbered within its run."""

from __future__ import annotations

import re

from django.db import models
from django.utils import timezone

from console.deployments.models import Replica


class Level(models.TextChoices):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    DEBUG = "debug"
    NONE = "", "—"


_LEVELS = [
    (re.compile(r"Traceback \(most recent call last\)|\b(ERROR|CRITICAL|FATAL)\b"), Level.ERROR),
    (re.compile(r"\bWARN(ING)?\b"), Level.WARNING),
    (re.compile(r"\bINFO\b"), Level.INFO),
    (re.compile(r"\bDEBUG\b"), Level.DEBUG),
]


def parse_level(text: str) -> str:
    """The level a line announces (vLLM: `INFO 12-02 10:00:00 [...]`); a traceback is an error."""
    head = text[:200]
    for pattern, level in _LEVELS:
        if pattern.search(head):
            return level
    return Level.NONE


def run_key(generation: int, run: int, member: int = 0) -> str:
    """How runs are named in URLs and the API: the agent's file stem, `gen<g>-run<n>`; for
    another member than the leader of a replica over several hosts `gen<g>-run<n>-rank<m>`."""
    return f"gen{generation}-run{run}" + (f"-rank{member}" if member else "")


class LogLine(models.Model):
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="log_lines")
    generation = models.PositiveIntegerField()
    run = models.PositiveIntegerField()
    member = models.PositiveSmallIntegerField(
        default=0, help_text="the member's rank in a replica over several hosts (0: the leader)"
    )
    line_no = models.PositiveIntegerField(help_text="1-based within the run")
    text = models.TextField()
    level = models.CharField(max_length=8, choices=Level.choices, blank=True)
    gap_before = models.BooleanField(default=False, help_text="lines before it were lost")
    at = models.DateTimeField(default=timezone.now, help_text="when the console received it")

    class Meta:
        ordering = ["replica", "generation", "run", "member", "line_no"]
        constraints = [
            models.UniqueConstraint(
                fields=["replica", "generation", "run", "member", "line_no"],
                name="uniq_log_line_member",
            )
        ]
        indexes = [
            models.Index(
                fields=["replica", "generation", "run", "level", "line_no"], name="log_line_level"
            )
        ]

    def __str__(self) -> str:
        return f"{self.replica_id} {self.run_key}:{self.line_no}"

    @property
    def run_key(self) -> str:
        return run_key(self.generation, self.run, self.member)

    @property
    def css(self) -> str:
        return {"error": "lvl-error", "warning": "lvl-warn", "debug": "lvl-debug"}.get(
            self.level, ""
        )
