from django.contrib import admin

from console.accounts.models import ApiToken, AuditEntry


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "user",
        "hint",
        "scope",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["scope"]
    search_fields = ["name", "user__username", "hint"]
    readonly_fields = ["key_hash", "hint", "created_at", "last_used_at"]

    def has_add_permission(self, request):
        return False  # created through the console so the value can be shown once


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["time", "actor", "via", "remote_addr", "action", "object_repr", "message"]
    list_filter = ["action", "via", "object_type"]
    search_fields = ["actor", "object_repr", "message"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
