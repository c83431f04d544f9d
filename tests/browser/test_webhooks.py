"""In a real browser: an admin adds an incident webhook, sees its secret once, presses "Send
test" and sees the receiver's answer (a real receiver on port 0 that verifies the timestamped
signature); a viewer sees the list masked. Screenshots: docs/screenshots/webhooks-*.png."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from console.diagnosis.models import WebhookEndpoint
from tests.browser.conftest import shot
from tests.console.diagnosis.test_webhooks import SECRET, TOKEN, Receiver
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _login(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def test_admin_adds_a_webhook_and_sends_a_test(page, browser, live_server, monkeypatch):
    monkeypatch.delenv("INCIDENT_WEBHOOK_URL", raising=False)
    make_user("ada", "admin")
    make_user("vera", "viewer")
    with Receiver(secret=SECRET) as receiver:
        _login(page, live_server.url, "ada")
        page.click("summary:has-text('Settings')")
        page.click("text=Incident webhooks")
        page.wait_for_url(f"{live_server.url}/incidents/webhooks/")

        page.fill("#wh-name", "oncall")
        page.fill("#wh-url", receiver.url())
        page.fill("#wh-secret", SECRET)
        page.select_option("#wh-sev", "critical")
        page.click("text=Add webhook")
        expect(page.get_by_test_id("new-webhook-secret")).to_contain_text(SECRET)
        row = page.locator("tr[data-webhook=oncall]")
        expect(row).to_contain_text(f"http://127.0.0.1:{receiver.port}/***")
        expect(row).not_to_contain_text(TOKEN)
        shot(page, "webhooks-created")

        row.get_by_test_id("webhook-send-test").click()
        result = page.get_by_test_id("webhook-test-result")
        expect(result).to_contain_text("receiver answered HTTP 200")
        expect(page.get_by_test_id("webhook-last")).to_contain_text("HTTP 200")
        [delivery] = receiver.received
        assert delivery.verified and delivery.json["event"] == "test"
        shot(page, "webhooks-send-test")

        receiver.answers = [503]  # the receiver is down: the page says so
        page.locator("tr[data-webhook=oncall]").get_by_test_id("webhook-send-test").click()
        expect(page.get_by_test_id("webhook-test-result")).to_contain_text("HTTP 503")

        page.reload()
        assert SECRET not in page.content()  # shown once only

    viewer = browser.new_context(viewport={"width": 1280, "height": 700})
    try:
        vpage = viewer.new_page()
        _login(vpage, live_server.url, "vera")
        vpage.goto(f"{live_server.url}/incidents/webhooks/")
        expect(vpage.locator("tr[data-webhook=oncall]")).to_contain_text("/***")
        expect(vpage.get_by_test_id("webhook-send-test")).to_have_count(0)
        expect(vpage.locator("text=Add webhook")).to_have_count(0)
        assert TOKEN not in vpage.content() and SECRET not in vpage.content()
        shot(vpage, "webhooks-viewer")
    finally:
        viewer.close()
    assert WebhookEndpoint.objects.get(name="oncall").last_status == 503
