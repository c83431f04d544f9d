"""When a live page's refresh fails, the page says so (and keeps the last data); when the
console answers again, the message goes away."""

from __future__ import annotations

import pytest

from tests.browser.test_login_and_inventory import login
from tests.factories import make_node
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_failed_live_refresh_is_shown_then_cleared(page, live_server):
    make_user("ada", "admin")
    make_node("kp-01", npus=2)
    login(page, live_server, "ada", "pw-ada-123")
    page.wait_for_url(f"{live_server.url}/nodes/")
    page.goto(f"{live_server.url}/")
    banner = page.locator("[data-testid=conn-status]")
    assert banner.count() == 0

    def fail(route):
        if route.request.headers.get("hx-request"):
            route.fulfill(status=503, body="down")
        else:
            route.continue_()

    page.route(f"{live_server.url}/?*", fail)
    page.wait_for_selector("[data-testid=conn-status]", timeout=15_000)
    assert "HTTP 503" in banner.inner_text()
    assert page.locator("[data-testid=nodes-total]").inner_text() == "1"  # last data kept

    page.unroute(f"{live_server.url}/?*")
    page.wait_for_selector("[data-testid=conn-status]", state="detached", timeout=15_000)
