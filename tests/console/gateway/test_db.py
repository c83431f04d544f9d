"""The gateway's ORM reads survive a connection the database dropped (console/gateway/db.py):
Django's request signals never run for the gateway, so without the check every /v1 request
after a PostgreSQL restart failed on the dead connection until the process restarted."""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.db import connection
from starlette.testclient import TestClient

from console.accounts.services import Actor, create_token
from console.asgi import application
from console.gateway import auth
from tests.helpers import make_user


def _drop_gateway_connection() -> None:
    """Kill the connection the gateway's ORM thread holds: on PostgreSQL as an administrator
    does (pg_terminate_backend: what the outage fault test and a server restart do), on
    SQLite by closing it underneath Django."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    else:  # the thread the gateway's reads run in (asgiref's one shared executor thread)
        asyncio.run(sync_to_async(lambda: connection.connection.close())())


def test_a_dropped_connection_is_replaced_before_the_next_read(gateway_db_thread, redis_url):
    user = make_user("gw-db", "viewer")
    _, raw = create_token(actor=Actor(user=user, name=user.username), name="gw")
    headers = {"Authorization": f"Bearer {raw}"}
    auth.forget()
    with TestClient(application) as client:
        assert client.get("/v1/models", headers=headers).status_code == 200
        _drop_gateway_connection()
        auth.forget()  # the next request must read the token from the database again
        resp = client.get("/v1/models", headers=headers)
        assert resp.status_code == 200, resp.text


def test_reads_keep_their_connection_while_it_answers(gateway_db_thread):
    """The routing table is read every second: on SQLite too (CONN_MAX_AGE 0) the reads keep
    one connection instead of opening one each time, and replace it once it is gone."""
    from console.gateway import db

    def current():
        connection.ensure_connection()
        return connection.connection  # the object: an id could be reused once it is freed

    async def reads():
        return [await db.read(current) for _ in range(3)]

    first, second, third = asyncio.run(reads())
    assert first is second is third
    _drop_gateway_connection()
    assert asyncio.run(db.read(current)) is not first or connection.vendor == "postgresql"
