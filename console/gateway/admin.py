from django.contrib import admin

from console.adminsite import ReadOnlyAdmin

from .models import RateLimit, Usage


@admin.register(Usage)
class UsageAdmin(admin.ModelAdmin):
    list_display = (
        "day",
        "token_name",
        "user",
        "model",
        "requests",
        "errors",
        "prompt_tokens",
        "completion_tokens",
    )
    list_filter = ("day", "model")
    search_fields = ("token_name", "model")
    readonly_fields = [f.name for f in Usage._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False  # counted by the gateway only


@admin.register(RateLimit)
class RateLimitAdmin(ReadOnlyAdmin):
    """Set on the gateway page or the API (services.py audits every change and tells every
    console process at once)."""

    list_display = ("token", "model", "requests_per_minute", "tokens_per_minute", "concurrent")
