"""Migrations are complete (no model change without one) and apply on this database."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command
from django.db import connection


def test_no_missing_migrations(db):
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_migrations_applied_on_this_database(db):
    tables = connection.introspection.table_names()
    assert {
        "inventory_node",
        "inventory_accelerator",
        "accounts_apitoken",
        "accounts_auditentry",
    } <= set(tables)


def test_every_model_is_registered_in_the_admin():
    from django.apps import apps
    from django.contrib import admin

    ours = [m for m in apps.get_models() if m.__module__.startswith("console.") and m._meta.managed]
    assert ours
    missing = [m.__name__ for m in ours if m not in admin.site._registry]
    assert not missing, f"not in the Django admin: {missing}"
