from django.contrib import admin

from console.inventory.models import Accelerator, Node


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
