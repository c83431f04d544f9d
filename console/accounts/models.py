"""Roles, API tokens and the append-only audit log."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "npc_"


class Role(models.TextChoices):
    """Roles are Django groups of the same name; each includes the one before it."""

    VIEWER = "viewer", "Viewer"
    OPERATOR = "operator", "Operator"
    ADMIN = "admin", "Admin"


# The permission each role adds; a role holds its own and all lower ones.
ROLE_PERMISSIONS: dict[str, list[str]] = {
    Role.VIEWER: ["view_console"],
    Role.OPERATOR: ["view_console", "operate_console"],
    Role.ADMIN: ["view_console", "operate_console", "administer_console"],
}


class ConsolePermission(models.Model):
    """Holds the console's role permissions; it has no table of its own."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_console", "Can view nodes, deployments, telemetry and logs"),
            ("operate_console", "Can drain nodes, isolate NPUs, start and stop engines"),
            ("administer_console", "Can manage users, enrollment and everyone's tokens"),
        ]

    def __str__(self) -> str:
        return "console permissions"


class TokenScope(models.TextChoices):
    READ = "read", "Read only"
    WRITE = "write", "Read and write"


def hash_token(raw: str) -> str:
    """SHA-256 of a token. Tokens carry 256 bits of randomness, so a fast hash is enough."""
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    """A bearer token for the REST API. Only its hash is stored; the value is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(
        max_length=12, editable=False, help_text="first characters, to tell tokens apart"
    )
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.READ)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    allowed_models = models.JSONField(
        default=list,
        blank=True,
        help_text="served model names this token may call through the gateway; empty: all",
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        editable=False,
        help_text="the token that created this one; revoking it revokes this one",
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}…)"

    def may_use_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    @staticmethod
    def generate() -> str:
        return TOKEN_PREFIX + secrets.token_urlsafe(32)

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)

    @property
    def state(self) -> str:
        if self.revoked_at:
            return "revoked"
        if self.expires_at and self.expires_at <= timezone.now():
            return "expired"
        return "active"


class AuditEntry(models.Model):
    """One state-changing action: who, what, when, from where, before and after.

    Append-only: saving an existing row or deleting one raises. Modelled on NetBox's
    ObjectChange (actor + request id + object reference + pre/post data).
    """

    time = models.DateTimeField(default=timezone.now, db_index=True, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor = models.CharField(max_length=150, help_text="user name, token or 'system'")
    via = models.CharField(max_length=16, default="web")  # web, api, token, system, agent
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    action = models.CharField(max_length=64, db_index=True)  # e.g. node.set_status
    object_type = models.CharField(max_length=64, blank=True, db_index=True)
    object_id = models.CharField(max_length=64, blank=True, db_index=True)
    object_repr = models.CharField(max_length=200, blank=True)
    message = models.CharField(max_length=500, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["object_type", "object_id", "-time"])]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_repr}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("audit entries are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("audit entries are append-only")


class AccountState(models.Model):
    """What the console keeps about a user beyond Django's User: whether the password must be
    changed before anything else (the generated first admin's; accounts/middleware.py)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="console_state"
    )
    must_change_password = models.BooleanField(
        default=False, help_text="a generated password: changed at the next sign-in"
    )

    def __str__(self) -> str:
        return f"state of {self.user}"
