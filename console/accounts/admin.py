"""Django's admin site, audited: every user, role (group) and token change made here writes
an audit entry (services.record, actor = the signed-in admin, via "admin"), in the
transaction of the change. Passwords are never written to the log, only that one changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.db import router, transaction

from console.accounts.models import AccountState, ApiToken, AuditEntry
from console.accounts.services import Actor, actor_from_request, record

User = get_user_model()


def admin_actor(request) -> Actor:
    return dataclasses.replace(actor_from_request(request), via="admin")


def user_state(user) -> dict:
    """What the audit log keeps of a user: flags, roles and permissions, never the hash."""
    return {
        "username": user.get_username(),
        "email": user.email,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "is_active": user.is_active,
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "password_usable": user.has_usable_password(),
        "roles": sorted(user.groups.values_list("name", flat=True)),
        "permissions": sorted(user.user_permissions.values_list("codename", flat=True)),
    }


def group_state(group: Group) -> dict:
    return {
        "name": group.name,
        "permissions": sorted(group.permissions.values_list("codename", flat=True)),
    }


def _changed(before: dict | None, after: dict) -> tuple[dict | None, dict]:
    """Only the keys whose value changed (all of `after` for a new object)."""
    if before is None:
        return None, after
    keys = [k for k in after if before.get(k) != after[k]]
    return {k: before.get(k) for k in keys}, {k: after[k] for k in keys}


class AuditedAdmin(admin.ModelAdmin):
    """save/delete hooks that record one entry per object. `state` reads what is kept; the
    entry is written after save_related, when many-to-many fields (groups) are saved too."""

    kind = ""
    state: Callable[[Any], dict]  # what is kept of an object: each subclass names its own

    def save_model(self, request, obj, form, change):
        form._audit_before = self.state(type(obj).objects.get(pk=obj.pk)) if change else None
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        obj = form.instance
        before, after = _changed(form._audit_before, self.state(obj))
        if change and not after:
            return  # saved with nothing changed
        action = f"{self.kind}.change" if change else f"{self.kind}.create"
        record(actor=admin_actor(request), action=action, obj=obj, before=before, after=after)

    def delete_model(self, request, obj):
        record(
            actor=admin_actor(request),
            action=f"{self.kind}.delete",
            obj=obj,
            before=self.state(obj),
        )
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic(using=router.db_for_write(self.model)):
            for obj in queryset:
                self.delete_model(request, obj)


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(AuditedAdmin, UserAdmin):
    kind = "user"

    def state(self, obj) -> dict:
        return user_state(obj)

    def user_change_password(self, request, id, form_url=""):
        """Django's form; the change and its audit entry commit together."""
        with transaction.atomic(using=router.db_for_write(self.model)):
            pk = unquote(id)
            before = User.objects.filter(pk=pk).values_list("password", flat=True).first()
            response = super().user_change_password(request, id, form_url)
            user = User.objects.filter(pk=pk).first()
            if user is not None and before is not None and user.password != before:
                record(
                    actor=admin_actor(request),
                    action="user.password_change",
                    obj=user,
                    message="set in the admin site"
                    if user.has_usable_password()
                    else "password sign-in disabled in the admin site",
                )
        return response


@admin.register(Group)
class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    """Groups are the console's roles: a change to their permissions changes what a role may."""

    kind = "role"

    def state(self, obj) -> dict:
        return group_state(obj)


@admin.register(ApiToken)
class ApiTokenAdmin(AuditedAdmin):
    kind = "token"
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

    def state(self, obj) -> dict:
        return {
            "name": obj.name,
            "user": obj.user.get_username(),
            "scope": obj.scope,
            "allowed_models": obj.allowed_models,
            "expires_at": obj.expires_at.isoformat() if obj.expires_at else None,
            "revoked_at": obj.revoked_at.isoformat() if obj.revoked_at else None,
        }


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


@admin.register(AccountState)
class AccountStateAdmin(AuditedAdmin):
    """Setting must_change_password here makes that user choose a new password at the next
    sign-in (accounts/middleware.py)."""

    kind = "account"
    list_display = ["user", "must_change_password"]
    list_filter = ["must_change_password"]
    search_fields = ["user__username"]

    def state(self, obj) -> dict:
        return {"user": obj.user.get_username(), "must_change_password": obj.must_change_password}
