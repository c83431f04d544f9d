"""What each token used through the gateway, per model and day."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from console.accounts.models import ApiToken


class Usage(models.Model):
    """Requests and tokens counted per (token, model, day). Counters are summed in Redis on
    the request path and folded in here by `gateway.flush_usage`; nothing else writes them."""

    day = models.DateField()
    token = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    token_name = models.CharField(max_length=100, help_text="kept if the token is deleted")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    model = models.CharField(max_length=200)
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["-day", "model", "token_name"]
        constraints = [
            models.UniqueConstraint(fields=["day", "token", "model"], name="uniq_usage_day_token")
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.token_name} {self.model}"
