"""Promise: no state-changing request rides on the session cookie alone.

Every page route refuses a POST without a CSRF token (checked before any view runs); every
`<form method="post">` in the templates carries the token; htmx requests carry it through
`hx-headers` on `<body>` (templates/base.html), and that header is accepted; the API refuses
session-authenticated writes without it. Bearer-token calls need no CSRF token: a browser
never adds an Authorization header on its own.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from django.test import Client

from tests.helpers import make_user

pytestmark = [pytest.mark.security, pytest.mark.django_db]

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def csrf_client(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def htmx_token(client: Client) -> str:
    """The token as htmx sends it: from hx-headers on <body> of a rendered page."""
    page = client.get("/").content.decode()
    attr = re.search(r"<body[^>]*\shx-headers='([^']*)'", page)
    assert attr, "base.html: <body> has no hx-headers"
    headers = json.loads(html.unescape(attr.group(1)))
    assert headers.get("X-CSRFToken"), headers
    return headers["X-CSRFToken"]


def is_csrf_refusal(resp) -> bool:
    return resp.status_code == 403 and b"CSRF" in resp.content


def test_every_page_refuses_a_post_without_the_token_and_accepts_htmx_s(db):
    from tests.security.test_authz_matrix import concrete, make_world, page_routes

    admin = make_user("csrf-admin", "admin")
    world = make_world(admin)
    client = csrf_client(admin)
    token = htmx_token(client)
    refused = 0
    for route, _pattern in page_routes():
        path = concrete(world, route)
        if path.startswith(("/metrics", "/logout")):
            continue
        resp = client.post(path, {"name": "x"})
        assert is_csrf_refusal(resp), f"POST {path} without a CSRF token gave {resp.status_code}"
        refused += 1
    assert refused >= 25
    # the same requests with htmx's header pass the CSRF check (whatever the view answers)
    for route, _pattern in page_routes():
        path = concrete(world, route)
        if path.startswith(("/metrics", "/logout")):
            continue
        resp = client.post(path, {}, HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
        assert not is_csrf_refusal(resp), f"POST {path} with htmx's token was refused as CSRF"


def test_login_and_logout_need_the_token(db):
    make_user("csrf-user", "viewer")
    anon = Client(enforce_csrf_checks=True)
    resp = anon.post("/login/", {"username": "csrf-user", "password": "pw-csrf-user-123"})
    assert is_csrf_refusal(resp)
    signed_in = csrf_client(make_user("csrf-out", "viewer"))
    assert is_csrf_refusal(signed_in.post("/logout/"))
    assert signed_in.get("/").status_code == 200  # still signed in


def test_api_refuses_session_writes_without_the_token(db):
    from console.accounts.models import ApiToken

    client = csrf_client(make_user("csrf-op", "operator"))
    before = ApiToken.objects.count()
    resp = client.post("/api/v1/tokens", {"name": "x"}, content_type="application/json")
    assert resp.status_code == 403, resp.content
    assert ApiToken.objects.count() == before
    resp = client.post(
        "/api/v1/tokens",
        {"name": "x"},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=htmx_token(client),
    )
    assert resp.status_code in (200, 201), resp.content
    assert ApiToken.objects.count() == before + 1


def test_bearer_token_writes_need_no_csrf_token(db):
    from console.accounts.services import Actor, create_token

    op = make_user("csrf-bearer", "operator")
    _, raw = create_token(actor=Actor(user=op, name="t"), name="w", scope="write")
    resp = Client(enforce_csrf_checks=True).post(
        "/api/v1/tokens",
        {"name": "y"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )
    assert resp.status_code in (200, 201), resp.content


def test_every_post_form_in_the_templates_carries_the_token():
    forms = 0
    for template in TEMPLATES.rglob("*.html"):
        text = template.read_text()
        for match in re.finditer(r"<form\b[^>]*>(.*?)</form>", text, re.S | re.I):
            tag = match.group(0)[: match.group(0).index(">") + 1]
            if not re.search(r"method=[\"']?post", tag, re.I):
                continue
            forms += 1
            assert "{% csrf_token %}" in match.group(1), f"{template}: {tag}"
    assert forms >= 10


def test_base_template_sends_the_token_with_every_htmx_request():
    base = (TEMPLATES / "base.html").read_text()
    assert re.search(r"<body[^>]*hx-headers='\{\"X-CSRFToken\": \"\{\{ csrf_token \}\}\"\}'", base)
    # no template replaces <body>'s hx-headers with one that lacks the token
    for template in TEMPLATES.rglob("*.html"):
        for attr in re.findall(r"hx-headers='([^']*)'", template.read_text()):
            assert "csrf_token" in attr, f"{template}: hx-headers without the CSRF token"
