"""PostgreSQL drops the web app's connections and refuses new ones for a while: every
request meanwhile gets a clean 503 (JSON under /api/, a small page elsewhere; no traceback),
and the same server process answers normally once the database is back.

A real uvicorn serving the console; the outage is made on the test database only (its
connections terminated, new ones refused), never by stopping the shared server.
Promise: docs/faults.md "Database connection lost".
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

import psycopg
import pytest
from django.db import connection

from tests.helpers import client_for
from tests.kit import Proc, child_env, free_port, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.backend]


def get(url: str, cookie: str):
    req = urllib.request.Request(url, headers={"Cookie": f"sessionid={cookie}"})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.read().decode(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


class Outage:
    """Refuse and drop every connection to one database, from the maintenance database."""

    def __init__(self, name: str) -> None:
        s = connection.settings_dict
        self.name = name
        self.admin = psycopg.connect(
            host=s.get("HOST") or "127.0.0.1",
            port=s.get("PORT") or 5432,
            user=s.get("USER") or "postgres",
            password=s.get("PASSWORD") or None,
            dbname="postgres",
            autocommit=True,
        )

    def begin(self) -> None:
        ident = psycopg.sql.Identifier(self.name)
        self.admin.execute(
            psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(ident)
        )
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [self.name],
        )

    def end(self) -> None:
        ident = psycopg.sql.Identifier(self.name)
        self.admin.execute(
            psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(ident)
        )


@pytest.mark.django_db(transaction=True)
def test_database_outage_answers_503_then_recovers_without_restart(redis_url, admin_user, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (DATABASE_URL=postgres://…): the outage is made there")
    cookie = client_for(admin_user).cookies["sessionid"].value
    port = free_port()
    web = Proc(
        [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port", str(port)],
        child_env(redis_url),
        tmp_path / "uvicorn.log",
    )
    base = f"http://127.0.0.1:{port}"
    outage = Outage(connection.settings_dict["NAME"])
    try:
        wait_for(lambda: _up(base, cookie), 60, interval=0.3, message="uvicorn to answer")
        assert get(f"{base}/api/v1/nodes", cookie)[0] == 200  # a kept connection now exists
        outage.begin()
        connection.close()  # ours was terminated too
        for _ in range(3):
            status, body, headers = get(f"{base}/api/v1/nodes", cookie)
            assert status == 503 and headers.get("Retry-After") == "5", body
            assert "database is unavailable" in body and "Traceback" not in body
            status, body, headers = get(f"{base}/nodes/", cookie)
            assert status == 503 and "Database unavailable" in body, body
            assert "Traceback" not in body and "OperationalError" not in body
        outage.end()
        status, body, _ = get(f"{base}/api/v1/nodes", cookie)  # the very next request
        assert status == 200, body
        assert get(f"{base}/nodes/", cookie)[0] == 200
        assert web.popen.poll() is None  # the same process: nothing restarted
    except AssertionError:
        print("--- uvicorn ---\n", web.output()[-6000:])
        raise
    finally:
        outage.end()
        outage.admin.close()
        web.stop()


def _up(base: str, cookie: str) -> bool:
    try:
        return get(f"{base}/api/v1/nodes", cookie)[0] == 200
    except OSError:
        return False


@pytest.mark.django_db
def test_a_lost_connection_is_a_503_on_any_database(admin_user, monkeypatch):
    """The same mapping without PostgreSQL: the session lookup (the first query of every
    request) fails as a dropped connection does."""
    from django.db import OperationalError
    from django.test import Client

    client = Client(raise_request_exception=False)
    client.force_login(admin_user)

    def lost(self):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("django.contrib.sessions.backends.db.SessionStore.load", lost)
    api = client.get("/api/v1/nodes")
    assert api.status_code == 503 and api.json()["message"].startswith("the console's database")
    page = client.get("/nodes/")
    assert page.status_code == 503 and b"Database unavailable" in page.content
    assert page["Retry-After"] == "5"
