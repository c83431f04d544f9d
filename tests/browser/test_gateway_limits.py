"""The gateway page: an admin sets a rate limit for a token in the browser, sees it listed,
and removes it; a viewer sees the list without the form."""

from __future__ import annotations

import pytest

from console.accounts.services import Actor, create_token
from console.gateway.models import RateLimit
from tests.browser.conftest import shot
from tests.browser.test_login_and_inventory import login
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_sets_and_removes_a_limit(page, live_server):
    make_user("ada", "admin")
    vic = make_user("vic", "viewer")
    token, _ = create_token(actor=Actor(user=vic, name="vic"), name="ci-bot")
    page.set_viewport_size({"width": 1280, "height": 900})
    login(page, live_server, "ada", "pw-ada-123")
    page.wait_for_url(f"{live_server.url}/nodes/")
    page.goto(f"{live_server.url}/gateway/")
    form = page.get_by_test_id("limit-form")
    form.get_by_label("Token", exact=True).select_option(label="ci-bot (vic)")
    form.get_by_label("Model", exact=True).fill("deepseek-r1")
    form.get_by_label("Requests per minute").fill("60")
    form.get_by_label("Concurrent requests").fill("4")
    form.get_by_role("button", name="Set limit").click()
    page.wait_for_url(f"{live_server.url}/gateway/")
    table = page.locator("#limits-table")
    row = table.locator("tbody tr").first
    assert "ci-bot" in row.inner_text() and "deepseek-r1" in row.inner_text()
    limit = RateLimit.objects.get()
    assert (limit.token_id, limit.model, limit.requests_per_minute, limit.concurrent) == (
        token.pk,
        "deepseek-r1",
        60,
        4,
    )
    # a bad value: the message says which field, nothing changes
    form = page.get_by_test_id("limit-form")
    form.get_by_label("Tokens per minute").fill("lots")
    form.get_by_role("button", name="Set limit").click()
    page.wait_for_url(f"{live_server.url}/gateway/")
    assert "tokens per minute must be a whole number" in page.locator(".alert--error").inner_text()
    assert RateLimit.objects.count() == 1
    shot(page, "gateway-limits")
    page.once("dialog", lambda d: d.accept())
    row.get_by_test_id("limit-delete").click()
    page.wait_for_url(f"{live_server.url}/gateway/")
    assert not RateLimit.objects.exists()
    assert page.locator("#limits-table").count() == 0
