"""Promise (docs/operations.md, "Backup and restore"): the documented pg_dump command, restored
with the documented pg_restore command into a fresh database, gives back every row of every
table and the same applied migrations.

PostgreSQL only (skipped on SQLite). The restore goes into a scratch database
test_restore_<pid>, dropped afterwards; no other database is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from console.accounts.services import Actor
from console.inventory.enrollment import create_enrollment_token
from tests.factories import make_node
from tests.helpers import make_user

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operations.md"

# The commands of docs/operations.md, word for word (the doc runs them through
# `docker compose exec -T postgres`, where -U npu and the database are given the same way).
DUMP = ["pg_dump", "--format=custom", "--no-owner", "--no-privileges"]
RESTORE = ["pg_restore", "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction"]

pytestmark = pytest.mark.django_db(transaction=True)  # pg_dump must see committed rows


@pytest.fixture
def pg():
    if connection.vendor != "postgresql":
        pytest.skip("backup and restore are PostgreSQL's (DATABASE_URL is not PostgreSQL)")
    if not (shutil.which("pg_dump") and shutil.which("pg_restore")):
        pytest.skip("pg_dump / pg_restore are not installed")
    s = connection.settings_dict
    params = {
        "host": s.get("HOST") or "127.0.0.1",
        "port": str(s.get("PORT") or 5432),
        "user": s.get("USER") or "postgres",
    }
    env = {**os.environ, "PGPASSWORD": s.get("PASSWORD") or ""}
    return params, env, s["NAME"]


def _cli(params: dict[str, str]) -> list[str]:
    return ["--host", params["host"], "--port", params["port"], "--username", params["user"]]


def _connect(params: dict[str, str], env: dict[str, str], dbname: str) -> psycopg.Connection:
    return psycopg.connect(
        dbname=dbname, password=env["PGPASSWORD"] or None, autocommit=True, **params
    )


def snapshot(conn: psycopg.Connection) -> dict[str, list[tuple]]:
    """Every row of every table in the public schema, sorted, as text."""
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
    ]
    found = {}
    for table in tables:
        query = sql.SQL("SELECT t::text FROM {} AS t").format(sql.Identifier(table))
        found[table] = sorted(row[0] for row in conn.execute(query))
    return found


def seed() -> None:
    admin = make_user("ada", "admin")
    create_enrollment_token(actor=Actor(user=admin, name="ada"), name="fleet")
    make_node("kp-01", npus=8, labels={"zone": "a"}, agent_version="0.1.0")
    make_node("kp-02", npus=2, status="offline")


def test_documented_dump_restores_every_row_and_migration(pg, tmp_path):
    params, env, source = pg
    seed()
    scratch = f"test_restore_{os.getpid()}"
    dump = tmp_path / "npu_console.dump"
    with dump.open("wb") as out:
        subprocess.run([*DUMP, *_cli(params), source], stdout=out, env=env, check=True)
    with _connect(params, env, "postgres") as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(scratch)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(scratch)))
    try:
        subprocess.run(
            [*RESTORE, *_cli(params), "--dbname", scratch, str(dump)], env=env, check=True
        )
        with _connect(params, env, source) as a, _connect(params, env, scratch) as b:
            before, after = snapshot(a), snapshot(b)
            migrations = b.execute("SELECT app, name FROM django_migrations").fetchall()
            nodes = b.execute("SELECT name FROM inventory_node ORDER BY name").fetchall()
    finally:
        with _connect(params, env, "postgres") as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(scratch))
            )
    assert nodes == [("kp-01",), ("kp-02",)]
    assert ("inventory", "0001_initial") in migrations
    assert len(after["inventory_accelerator"]) == 10
    assert after.keys() == before.keys()
    for table in before:
        assert after[table] == before[table], table


def test_snapshot_sees_a_lost_row(pg):
    """The comparison above can fail: one row missing is a difference."""
    params, env, source = pg
    seed()
    with _connect(params, env, source) as conn:
        before = snapshot(conn)
        conn.execute(
            "DELETE FROM inventory_accelerator WHERE id = (SELECT min(id) FROM inventory_accelerator)"
        )
        assert snapshot(conn)["inventory_accelerator"] != before["inventory_accelerator"]


def test_the_documented_commands_are_these():
    text = DOC.read_text()
    assert " ".join(DUMP) in text
    assert " ".join(RESTORE) in text
