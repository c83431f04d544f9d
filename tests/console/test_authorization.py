"""Every route refuses anonymous callers; writes refuse viewers and read-only tokens.

Routes are found by walking the URL resolver and the OpenAPI schema, so a new route cannot
escape these checks by being forgotten here.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from console.accounts.middleware import SELF_AUTHENTICATING
from console.accounts.services import Actor, create_token

SAMPLE_ARGS = {
    "int": "1",
    "slug": "node-x",
    "str": "x",
    "path": "x",
    "uuid": "00000000-0000-0000-0000-000000000000",
}


def walk(patterns, prefix=""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p


def concrete(route: str) -> str | None:
    """A concrete path for a route, or None for regex routes we cannot fill."""
    route = re.sub(
        r"<(?:(\w+):)?(\w+)>", lambda m: SAMPLE_ARGS.get(m.group(1) or "str", "x"), route
    )
    if any(ch in route for ch in "^$()?[]\\"):
        route = re.sub(r"\(\?P<\w+>[^)]*\)", "1", route).lstrip("^").rstrip("$").replace("\\", "")
        if any(ch in route for ch in "^$()?[]*+"):
            return None
    return "/" + route


def page_routes():
    """(path, pattern name) for every non-API URL pattern."""
    for route, pattern in walk(get_resolver().url_patterns):
        if route.startswith("api/v1/"):
            continue
        path = concrete(route)
        if path is not None:
            yield path, pattern.name


def api_operations(include_read_only_posts: bool = True):
    """(method, path) of every API operation in the OpenAPI schema. A POST marked
    `x-read-only` (e.g. /diagnose: text in, answer out, nothing stored) reads."""
    from console.api import api

    schema = api.get_openapi_schema()
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            if not include_read_only_posts and op.get("x-read-only"):
                continue
            concrete_path = re.sub(r"\{[^}]+\}", "1", path)
            yield method.upper(), concrete_path


LOGIN_EXEMPT = {"login"}


@pytest.mark.django_db
def test_every_page_redirects_anonymous_to_login():
    client = Client()
    checked = 0
    for path, name in page_routes():
        if name in LOGIN_EXEMPT or path.startswith("/static/"):
            continue
        for method in ("get", "post"):
            resp = getattr(client, method)(path)
            if path.startswith(SELF_AUTHENTICATING):  # bearer-token routes answer 401 themselves
                expected = {401} if method == "get" else {401, 405}  # /metrics is GET-only
                assert resp.status_code in expected, (
                    f"{method.upper()} {path} gave {resp.status_code}"
                )
                continue
            assert resp.status_code == 302, (
                f"{method.upper()} {path} ({name}) gave {resp.status_code}"
            )
            assert "login" in resp["Location"], f"{path} redirected to {resp['Location']}"
            checked += 1
    assert checked >= 20  # the walk really found the routes


@pytest.mark.django_db
def test_every_api_operation_answers_401_to_anonymous():
    client = Client()
    ops = list(api_operations())
    assert len(ops) >= 10
    for method, path in ops:
        resp = client.generic(method, path, data="{}", content_type="application/json")
        assert resp.status_code == 401, f"{method} {path} gave {resp.status_code}"
        assert resp.json()["message"]


def test_api_docs_need_login(db):
    for path in ("/api/docs", "/api/v1/docs"):
        resp = Client().get(path, follow=True)
        assert resp.redirect_chain, path
        assert "/login/" in resp.redirect_chain[-1][0], path
    assert Client().get("/api/v1/openapi.json").status_code == 401  # JSON for API clients


def test_viewer_is_refused_every_state_changing_api_route(viewer_client):
    writes = [(m, p) for m, p in api_operations(False) if m not in {"GET", "HEAD", "OPTIONS"}]
    assert writes
    for method, path in writes:
        resp = viewer_client.generic(method, path, data="{}", content_type="application/json")
        assert resp.status_code == 403, f"{method} {path} gave {resp.status_code}"


def test_viewer_is_refused_every_state_changing_page(viewer_client):
    from console.accounts.decorators import role_required  # noqa: F401 - documents the mechanism

    posts = [
        (path, name)
        for path, name in page_routes()
        if name and not path.startswith("/admin") and name not in LOGIN_EXEMPT | {"logout"}
    ]
    refused = 0
    for path, name in posts:
        view = get_resolver().resolve(path).func
        if getattr(view, "required_role", None) in {"operator", "admin"}:
            resp = viewer_client.post(path)
            if resp.status_code == 405:  # a GET-only operator page (e.g. the catalog picker)
                resp = viewer_client.get(path)
            assert resp.status_code == 403, path
            refused += 1
    assert refused >= 3


def test_viewer_can_read_pages_and_api(viewer_client):
    for path in ("/", "/nodes/", "/tokens/", "/api/v1/nodes", "/api/v1/accelerators", "/api/v1/me"):
        assert viewer_client.get(path).status_code == 200, path


def bearer(raw: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def test_tokens_work_and_revoked_or_expired_ones_fail(operator):
    actor = Actor(user=operator, name=operator.username)
    token, raw = create_token(actor=actor, name="ci", scope="write")
    client = Client()
    assert client.get("/api/v1/me", **bearer(raw)).json()["username"] == operator.username
    assert client.post("/api/v1/tokens/999/revoke", **bearer(raw)).status_code == 404  # authorized

    expired, expired_raw = create_token(
        actor=actor, name="old", expires_at=timezone.now() + timedelta(seconds=60)
    )
    type(expired).objects.filter(pk=expired.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert client.get("/api/v1/me", **bearer(expired_raw)).status_code == 401

    client.post(f"/api/v1/tokens/{token.pk}/revoke", **bearer(raw))
    assert client.get("/api/v1/me", **bearer(raw)).status_code == 401
    assert client.get("/api/v1/me", **bearer("npc_not-a-real-token")).status_code == 401


def test_read_only_token_may_read_but_not_write(operator):
    _, raw = create_token(actor=Actor(user=operator, name="otto"), name="ro", scope="read")
    client = Client()
    assert client.get("/api/v1/nodes", **bearer(raw)).status_code == 200
    resp = client.post(
        "/api/v1/tokens", data={"name": "x"}, content_type="application/json", **bearer(raw)
    )
    assert resp.status_code == 403
    assert "read-only" in resp.json()["message"]


def test_user_without_role_is_refused(db):
    from tests.helpers import client_for, make_user

    client = client_for(make_user("nobody", None))
    assert client.get("/").status_code == 403
    assert client.get("/api/v1/nodes").status_code == 403
