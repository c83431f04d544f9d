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
    limited = models.PositiveBigIntegerField(
        default=0, help_text="requests refused by a rate limit or fair share (429)"
    )

    class Meta:
        ordering = ["-day", "model", "token_name"]
        constraints = [
            models.UniqueConstraint(fields=["day", "token", "model"], name="uniq_usage_day_token")
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.token_name} {self.model}"


class RateLimit(models.Model):
    """A limit on gateway traffic, enforced across every console process (limits.py).

    Who it binds is given by `token` and `model`:

    - token and model: that token's requests for that model;
    - token only: that token's requests for every model;
    - model only: every token's requests for that model, counted together;
    - neither: the default for each token that has no token-only limit of its own.

    Each of `requests_per_minute`, `tokens_per_minute` (prompt + completion, from the usage
    the engine reports) and `concurrent` is off when empty."""

    token = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.CASCADE, related_name="rate_limits"
    )
    model = models.CharField(max_length=200, blank=True, default="")
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    concurrent = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["token_id", "model"]
        constraints = [
            models.UniqueConstraint(
                fields=["token", "model"],
                name="uniq_rate_limit_token_model",
                nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        who = f"token {self.token_id}" if self.token_id else "every token"
        return f"{who} · {self.model or 'every model'}"

    def as_dict(self) -> dict:
        return {
            "token_id": self.token_id,
            "model": self.model,
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "concurrent": self.concurrent,
        }
