"""The deployment form as an operator sees it (docs/security.md, "What an operator can make a
host do"): trust_remote_code is named as needing the admin role under its own field, nothing is
created; the memory allocator is a choice of names, never a path.

Run under `flock /tmp/npc-browser.lock`.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.deployments.models import Deployment
from tests.browser.conftest import shot
from tests.browser.test_ui_walk import fake_inspect, sign_in  # noqa: F401 - fixture
from tests.helpers import make_user
from tests.kit import make_node

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_is_told_trust_remote_code_needs_an_admin(page, live_server, fake_inspect):  # noqa: F811
    make_user("otto", "operator")
    make_node("kp-01", npus=8)
    sign_in(page, live_server, "otto")
    page.goto(f"{live_server.url}/deployments/new")
    page.fill("#name", "r1-7b")
    page.fill("#model_path", "/models/r1-7b")
    page.fill("#served_model_name", "r1-7b")
    page.fill("#max_model_len", "8192")
    page.select_option("#allocator", "jemalloc")
    page.check("input[name=trust_remote_code]")
    page.click("#deployment-form button[type=submit]")
    error = page.locator("[data-testid=field-error]", has_text="needs the admin role")
    expect(error).to_be_visible()
    expect(error).to_contain_text("--trust-remote-code")
    expect(page.locator("#allocator")).to_have_value("jemalloc")  # the input is kept
    error.scroll_into_view_if_needed()
    shot(page, "deployment-form-admin-only")
    assert not Deployment.objects.exists()

    page.uncheck("input[name=trust_remote_code]")
    page.click("#deployment-form button[type=submit]")
    page.wait_for_url("**/deployments/r1-7b/")
    assert Deployment.objects.get(name="r1-7b").allocator == "jemalloc"
