"""Promise: the OpenAPI schema is readable with a viewer's bearer token, so a client can be
generated without a browser session; without credentials it answers 401 (JSON, no redirect);
a role-less user's token or a revoked token gets nothing."""

from __future__ import annotations

import pytest
from django.test import Client

from console.accounts.services import Actor, create_token, revoke_token
from tests.helpers import make_user

pytestmark = [pytest.mark.security, pytest.mark.django_db]

URL = "/api/v1/openapi.json"


def token_for(user) -> tuple[int, str]:
    token, raw = create_token(actor=Actor(user=user, name=user.username), name="codegen")
    return token.pk, raw


def test_a_viewer_token_reads_the_schema():
    _, raw = token_for(make_user("vera", "viewer"))
    resp = Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert resp.status_code == 200, resp.content[:200]
    schema = resp.json()
    assert schema["openapi"].startswith("3.") and "/api/v1/deployments" in schema["paths"]


def test_anonymous_gets_401_json():
    resp = Client().get(URL)
    assert resp.status_code == 401 and resp["Content-Type"] == "application/json"
    assert "authentication required" in resp.json()["message"]
    bad = Client().get(URL, HTTP_AUTHORIZATION="Bearer npc_not-a-token")
    assert bad.status_code == 401


def test_revoked_and_roleless_tokens_read_nothing():
    vera = make_user("vera", "viewer")
    token_id, raw = token_for(vera)
    revoke_token(actor=Actor(user=vera, name="vera"), token_id=token_id)
    assert Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
    _, nobody = token_for(make_user("nobody", None))
    resp = Client().get(URL, HTTP_AUTHORIZATION=f"Bearer {nobody}")
    assert resp.status_code == 403 and "viewer" in resp.json()["message"]


def test_a_signed_in_viewer_still_reads_schema_and_docs(viewer_client):
    assert viewer_client.get(URL).status_code == 200
    assert viewer_client.get("/api/v1/docs").status_code == 200
