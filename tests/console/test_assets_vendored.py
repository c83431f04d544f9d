"""Air-gapped data centres: no page loads anything from outside the console."""

from __future__ import annotations

import re

from tests.factories import make_node

ASSET = re.compile(r'(?:src|href)="([^"]+)"')


def test_pages_and_api_docs_load_only_local_assets(admin_client_):
    make_node("n1", npus=1)
    for path in (
        "/",
        "/nodes/",
        "/nodes/n1/",
        "/deployments/",
        "/deployments/new",
        "/tokens/",
        "/api/v1/docs",
    ):
        body = admin_client_.get(path).content.decode()
        urls = [u for u in ASSET.findall(body) if "://" in u or u.startswith("//")]
        assert not urls, f"{path} loads external assets: {urls}"


def test_vendored_assets_are_served(admin_client_):
    for path in (
        "/static/vendor/htmx/htmx.min.js",
        "/static/css/console.css",
        "/static/ninja/swagger-ui-bundle.js",
    ):
        resp = admin_client_.get(path)
        assert resp.status_code == 200, path
