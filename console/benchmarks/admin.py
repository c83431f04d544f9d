from django.contrib import admin

from console.benchmarks.models import BenchmarkRun


@admin.register(BenchmarkRun)
class BenchmarkRunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "deployment",
        "status",
        "created_at",
        "req_per_s",
        "output_tokens_per_s",
        "ttft_p99_ms",
    ]
    list_filter = ["status"]
    search_fields = ["deployment__name"]
    raw_id_fields = ["deployment", "created_by"]
