"""Promise: every response carries a Content-Security-Policy that allows scripts and styles
from the console only — no 'unsafe-inline', no 'unsafe-eval' — and no template needs more.

The browser side (no violation on any page, confirm dialogs and polls still working) is
tests/browser/test_csp.py; this is the header and a scan of the templates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.kit import make_deployment, make_node, make_replica

pytestmark = [pytest.mark.security, pytest.mark.django_db]

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def directives(header: str) -> dict[str, list[str]]:
    out = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            out[words[0]] = words[1:]
    return out


def assert_strict(response) -> None:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"{response.request['PATH_INFO']}: no Content-Security-Policy"
    policy = directives(header)
    assert "unsafe" not in header, header
    assert policy["script-src"] == ["'self'"] and policy["style-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"]


def test_pages_of_every_kind_carry_a_strict_policy(admin_client_, client):
    node = make_node("kp-01", npus=2)
    dep = make_deployment("d1", model_path="/models/x", served_model_name="x")
    replica = make_replica(dep, node=node)
    for path in [
        "/",
        "/nodes/kp-01/",
        "/deployments/d1/",
        "/deployments/new",
        f"/replicas/{replica.pk}/logs/",
        "/gateway/",
        "/api/v1/docs",
        "/no-such-page/",
    ]:
        response = admin_client_.get(path)
        assert response.status_code in (200, 404), (path, response.status_code)
        assert_strict(response)
    assert_strict(client.get("/login/"))  # anonymous
    assert_strict(client.get("/admin/login/"))
    assert_strict(admin_client_.get("/", HTTP_HX_REQUEST="true"))  # htmx partials too


def test_htmx_neither_injects_styles_nor_evaluates(admin_client_):
    """htmx adds an indicator <style> and runs hx-trigger filters with Function() unless its
    config says not to: the meta tag every page carries."""
    page = admin_client_.get("/").content.decode()
    meta = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page)
    assert meta and '"includeIndicatorStyles": false' in meta.group(1)
    assert '"allowEval": false' in meta.group(1)


INLINE = [
    (
        re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I),
        "inline <script>",
    ),
    (re.compile(r"\son[a-z]+\s*=", re.I), "on*= event handler"),
    (re.compile(r"\sstyle\s*=", re.I), "style= attribute"),
    (re.compile(r"<style", re.I), "<style> element"),
    (re.compile(r"\s(data-)?hx-on", re.I), "hx-on handler (evaluated)"),
    (re.compile(r"hx-trigger=\"[^\"]*\[", re.I), "hx-trigger [filter] (evaluated)"),
    (re.compile(r"hx-(vals|vars)='?\"?\s*(js|javascript):", re.I), "js: values (evaluated)"),
    (re.compile(r"href=\"javascript:", re.I), "javascript: link"),
]


@pytest.mark.parametrize(
    "template", sorted(TEMPLATES.rglob("*.html")), ids=lambda p: str(p.relative_to(TEMPLATES))
)
def test_no_template_needs_unsafe_inline_or_eval(template):
    text = template.read_text()
    found = [
        f"{what}: line {text.count(chr(10), 0, m.start()) + 1}"
        for pattern, what in INLINE
        for m in pattern.finditer(text)
    ]
    assert not found, found
