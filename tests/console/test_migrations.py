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
