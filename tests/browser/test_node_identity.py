"""In a real browser: an admin sees a node's identity, revokes it; enrollment token limits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console import __version__
from console.inventory.models import EnrollmentToken, NodeCredential
from tests.browser.conftest import shot
from tests.factories import make_node
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def sign_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-123")
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)


def test_admin_sees_the_node_identity_and_revokes_it(page, live_server, redis_url):
    make_user("ada", "admin")
    node = make_node("kp-910b-01", npus=2, agent_version=__version__)
    now = timezone.now()
    NodeCredential.objects.create(
        node=node,
        fingerprint="3f9a1c27d4e8b605",
        issued_at=now - timedelta(days=3),
        issued_via="token rack-a hosts",
        revoked_at=now - timedelta(days=1),
        revoked_reason="replaced by a new enrollment",
    )
    active = NodeCredential.objects.create(
        node=node,
        fingerprint="c41d09e7aa52f318",
        issued_at=now - timedelta(days=1),
        issued_via="token rack-a hosts",
        last_used_at=now - timedelta(seconds=20),
    )
    page.on("dialog", lambda dialog: dialog.accept())  # the confirm() before each action
    sign_in(page, live_server, "ada")
    page.goto(f"{live_server.url}/nodes/kp-910b-01/")
    panel = page.locator("[data-testid=node-identity]")
    expect(panel).to_be_visible()
    expect(panel.locator("[data-testid=credential-row]")).to_have_count(2)
    expect(panel.locator("[data-testid=credential-state]").first).to_contain_text("active")
    panel.scroll_into_view_if_needed()
    shot(page, "node-identity")

    panel.locator("input[name=reason]").fill("host sent for repair")
    panel.locator("[data-testid=revoke-credential]").click()
    page.wait_for_url("**/nodes/kp-910b-01/")
    expect(page.locator(".alert--ok, .alert--success").first).to_contain_text("revoked")
    state = page.locator("[data-testid=node-identity] [data-testid=credential-state]").first
    expect(state).to_contain_text("revoked")
    expect(state).to_contain_text("host sent for repair")
    active.refresh_from_db()
    assert active.revoked_at is not None

    page.locator("[data-testid=allow-reenroll]").click()
    expect(page.locator("[data-testid=reenroll-allowed]")).to_be_visible()
    page.locator("[data-testid=node-identity]").scroll_into_view_if_needed()
    shot(page, "node-identity-revoked")


def test_viewer_does_not_see_the_node_identity(page, live_server):
    make_user("vera", "viewer")
    make_node("kp-910b-01")
    sign_in(page, live_server, "vera")
    page.goto(f"{live_server.url}/nodes/kp-910b-01/")
    expect(page.locator("[data-testid=node-status]")).to_be_visible()
    expect(page.locator("[data-testid=node-identity]")).to_have_count(0)


def test_admin_creates_a_single_use_token_for_a_node_pattern(page, live_server):
    make_user("ada", "admin")
    sign_in(page, live_server, "ada")
    page.goto(f"{live_server.url}/enrollment/")
    page.fill("#en-name", "rack-b spare")
    page.fill("#en-pattern", "rack-b-*")
    page.check("[data-testid=single-use]")
    page.select_option("#en-expires", "168")
    page.click("button:has-text('Create enrollment token')")
    expect(page.locator("[data-testid=new-enrollment]")).to_be_visible()
    row = page.locator("[data-testid=enrollment-row]").first
    expect(row).to_contain_text("rack-b-*")
    expect(row).to_contain_text("0 / 1")
    token = EnrollmentToken.objects.get()
    assert (token.max_uses, token.node_pattern) == (1, "rack-b-*")
    assert token.expires_at - timezone.now() > timedelta(days=6)
    shot(page, "enrollment-limits")
