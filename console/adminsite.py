"""What the Django admin apps share."""

from __future__ import annotations

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """A model changed on the console's own pages and API only, where services audit every
    change, tell other processes and never show a secret: the admin site only lists it."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
