"""Promise: a page refused for want of a role answers 403 with the console's own page, saying
which role it needs and which one the user holds; the API's 403s stay JSON."""

from __future__ import annotations

import pytest

from tests.helpers import client_for, make_user

pytestmark = pytest.mark.django_db


def test_a_viewer_on_an_operator_page_is_told_the_roles(viewer_client):
    resp = viewer_client.get("/audit/")
    assert resp.status_code == 403
    assert "403.html" in [t.name for t in resp.templates]
    body = resp.content.decode()
    assert "This needs the <strong>operator</strong> role." in body
    assert 'data-testid="forbidden-user-role">viewer<' in body
    assert 'class="topbar"' in body  # the console's page, with its navigation


def test_an_operator_on_an_admin_page_is_told_the_roles(operator_client):
    body = operator_client.get("/enrollment/").content.decode()
    assert "This needs the <strong>admin</strong> role." in body
    assert 'data-testid="forbidden-user-role">operator<' in body


def test_a_user_without_a_role(db):
    body = client_for(make_user("nobody", None)).get("/").content.decode()
    assert "This needs the <strong>viewer</strong> role." in body
    assert 'data-testid="forbidden-user-role">no role<' in body


def test_api_refusals_stay_json(viewer_client):
    resp = viewer_client.post("/api/v1/deployments", {}, content_type="application/json")
    assert resp.status_code == 403 and resp["Content-Type"].startswith("application/json")
    assert "operator" in resp.json()["message"]
