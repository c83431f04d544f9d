"""Promise: API tokens and enrollment tokens are stored only as SHA-256 hashes; the database
never holds the value that was shown once."""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection

from console.accounts.models import ApiToken
from console.accounts.services import Actor, create_token
from console.inventory.enrollment import create_enrollment_token
from console.inventory.models import EnrollmentToken

pytestmark = [pytest.mark.security, pytest.mark.django_db]


def every_text_cell() -> str:
    """Every value of every row of every table, as text: a dump of the database."""
    cells = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608
            for row in cursor.fetchall():
                cells.extend(str(v) for v in row if v is not None)
    return "\n".join(cells)


def test_api_token_value_is_nowhere_in_the_database(admin_user, admin_client_):
    token, raw = create_token(actor=Actor(user=admin_user, name="ada"), name="ci", scope="write")
    # and through the API, which shows the value once
    via_api = admin_client_.post(
        "/api/v1/tokens", {"name": "api", "scope": "read"}, content_type="application/json"
    )
    assert via_api.status_code in (200, 201), via_api.content
    raw_api = via_api.json()["token"]

    dump = every_text_cell()
    for value in (raw, raw_api):
        assert value not in dump
        assert value[10:] not in dump  # not even the secret part (the first 10 are the hint)
        assert hashlib.sha256(value.encode()).hexdigest() in dump
    assert ApiToken.objects.get(pk=token.pk).key_hash == hashlib.sha256(raw.encode()).hexdigest()


def test_enrollment_token_value_is_nowhere_in_the_database(admin_user, admin_client_):
    token, raw = create_enrollment_token(actor=Actor(user=admin_user, name="ada"), name="rack-1")
    via_api = admin_client_.post(
        "/api/v1/enrollment-tokens", {"name": "rack-2"}, content_type="application/json"
    )
    assert via_api.status_code in (200, 201), via_api.content
    raw_api = via_api.json()["token"]

    dump = every_text_cell()
    for value in (raw, raw_api):
        assert value not in dump and value[10:] not in dump
        assert hashlib.sha256(value.encode()).hexdigest() in dump
    assert EnrollmentToken.objects.get(pk=token.pk).key_hash == (
        hashlib.sha256(raw.encode()).hexdigest()
    )


def test_token_lists_never_show_the_value_again(admin_user, admin_client_):
    _, raw = create_token(actor=Actor(user=admin_user, name="ada"), name="ci")
    _, raw_e = create_enrollment_token(actor=Actor(user=admin_user, name="ada"), name="rack")
    for path in ("/api/v1/tokens", "/tokens/", "/api/v1/enrollment-tokens", "/enrollment/"):
        body = admin_client_.get(path).content.decode()
        assert raw[10:] not in body and raw_e[10:] not in body, path
