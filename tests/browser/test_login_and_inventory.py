"""In a real browser: sign in, read the dashboard, open a node page."""

from __future__ import annotations

import pytest

from tests.browser.conftest import shot
from tests.factories import make_node
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def login(page, live_server, username: str, password: str) -> None:
    page.goto(f"{live_server.url}/nodes/")
    assert "/login/" in page.url  # anonymous users are sent to sign in
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")


def test_login_dashboard_and_node_page(page, live_server):
    make_user("ada", "admin")
    make_node(
        "kp-910b-01",
        npus=8,
        labels={"zone": "az1"},
        npu_driver_version="24.1.rc2",
        cann_version="8.1.RC1",
    )
    make_node("kp-310p-02", npus=4, status="offline")

    page.goto(f"{live_server.url}/login/")
    shot(page, "login")
    login(page, live_server, "ada", "pw-ada-123")
    page.wait_for_url(f"{live_server.url}/nodes/")
    page.goto(f"{live_server.url}/")
    assert page.locator("[data-testid=nodes-total]").inner_text() == "2"
    assert page.locator("[data-testid=npus-total]").inner_text() == "12"
    shot(page, "dashboard")

    page.goto(f"{live_server.url}/nodes/")
    page.click("text=kp-910b-01")
    page.wait_for_url("**/nodes/kp-910b-01/")
    assert page.locator("[data-testid=npu-row]").count() == 8
    assert "online" in page.locator("[data-testid=node-status]").inner_text()
    shot(page, "node-detail")


def test_wrong_password_is_refused(page, live_server):
    make_user("ada", "admin")
    login(page, live_server, "ada", "wrong")
    assert page.locator(".alert--error").is_visible()
    assert "/login/" in page.url
