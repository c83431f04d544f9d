"""Read-only admin for telemetry rows: millions of them, so no counts and no edits."""

from django.contrib import admin

from console.telemetry.models import ChipRollup, ChipSample


class ReadOnlyTelemetryAdmin(admin.ModelAdmin):
    show_full_result_count = False
    list_per_page = 100
    list_select_related = ["node"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ChipSample)
class ChipSampleAdmin(ReadOnlyTelemetryAdmin):
    list_display = [
        "time",
        "node",
        "npu_id",
        "chip_id",
        "aicore_percent",
        "hbm_used_mb",
        "temperature_c",
        "power_w",
    ]


@admin.register(ChipRollup)
class ChipRollupAdmin(ReadOnlyTelemetryAdmin):
    list_display = [
        "bucket",
        "resolution",
        "node",
        "npu_id",
        "chip_id",
        "aicore_avg",
        "aicore_max",
        "temperature_max",
    ]
    list_filter = ["resolution"]
