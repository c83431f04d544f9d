from django.contrib import admin

from console.adminsite import ReadOnlyAdmin
from console.diagnosis.models import Incident, IncidentNote, WebhookEndpoint, WebhookNotice


class IncidentNoteInline(admin.TabularInline):
    model = IncidentNote
    extra = 0
    readonly_fields = ["author", "user", "text", "at"]


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    list_display = ["id", "title", "category", "severity", "status", "count", "last_seen"]
    list_filter = ["status", "severity", "category"]
    search_fields = ["title", "subject", "fingerprint"]
    readonly_fields = ["fingerprint", "count", "first_seen", "last_seen", "diagnoses", "evidence"]
    inlines = [IncidentNoteInline]


@admin.register(IncidentNote)
class IncidentNoteAdmin(admin.ModelAdmin):
    list_display = ["incident", "author", "at"]
    search_fields = ["text", "author"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    list_display = ("name", "enabled", "min_severity", "renotify_minutes", "last_status")
    # the URL often embeds a token and the secret signs deliveries: neither is shown here
    exclude = ("url", "secret")


@admin.register(WebhookNotice)
class WebhookNoticeAdmin(ReadOnlyAdmin):
    list_display = ("incident", "endpoint_key", "sent_at", "count")
