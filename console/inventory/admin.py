from django.contrib import admin

from console.inventory.models import (
    Accelerator,
    EnrollmentToken,
    Node,
    NodeCheckRun,
    NodeCredential,
)


class AcceleratorInline(admin.TabularInline):
    model = Accelerator
    extra = 0
    fields = [
        "npu_id",
        "chip_id",
        "model_name",
        "health",
        "hbm_total_mb",
        "bus_id",
        "isolated",
        "isolation_reason",
    ]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "hostname",
        "arch",
        "status",
        "admin_state",
        "last_heartbeat",
        "simulated",
    ]
    list_filter = ["status", "admin_state", "arch", "simulated"]
    search_fields = ["name", "hostname", "address"]
    readonly_fields = ["last_heartbeat", "created_at"]
    inlines = [AcceleratorInline]


@admin.register(Accelerator)
class AcceleratorAdmin(admin.ModelAdmin):
    list_display = ["__str__", "model_name", "health", "hbm_total_mb", "bus_id", "isolated"]
    list_filter = ["health", "model_name", "isolated", "vendor"]
    search_fields = ["node__name", "bus_id", "serial"]


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "hint", "created_by", "created_at", "expires_at", "revoked_at"]
    readonly_fields = ["key_hash", "hint", "created_at"]

    def has_add_permission(self, request):
        return False  # created on the Enrollment page so the value can be shown once


@admin.register(NodeCheckRun)
class NodeCheckRunAdmin(admin.ModelAdmin):
    list_display = ["node", "trigger", "requested_by", "requested_at", "status"]
    list_filter = ["status", "trigger"]
    readonly_fields = ["results"]


@admin.register(NodeCredential)
class NodeCredentialAdmin(admin.ModelAdmin):
    """Read-only: credentials are issued by enrollment and changed by the node page's
    services (rotate, revoke), which audit each change and update Redis."""

    list_display = ["node", "fingerprint", "issued_at", "last_used_at", "revoked_at"]
    search_fields = ["node__name", "fingerprint"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
