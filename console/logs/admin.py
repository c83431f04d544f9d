"""Read-only admin for shipped log lines (many rows: no counts, no edits)."""

from django.contrib import admin

from console.logs.models import LogLine


@admin.register(LogLine)
class LogLineAdmin(admin.ModelAdmin):
    list_display = ["replica", "generation", "run", "line_no", "level", "text", "at"]
    list_filter = ["level"]
    search_fields = ["text"]
    show_full_result_count = False
    list_per_page = 100
    list_select_related = ["replica__deployment"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
