"""In a real browser: the generated first admin password is replaced at the first sign-in
before anything else opens; a viewer sent to an operator page sees why it is refused.

Run under `flock /tmp/npc-browser.lock`.
"""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from playwright.sync_api import expect

from console.accounts.models import AccountState, AuditEntry
from tests.browser.conftest import shot
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SUBMIT = "[data-testid=password-change] button[type=submit]"  # not the top bar's Sign out


def test_the_first_admin_changes_the_generated_password(page, live_server, monkeypatch):
    monkeypatch.delenv("NPU_CONSOLE_ADMIN_PASSWORD", raising=False)
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    generated = re.search(r"with password: (\S+)", out.getvalue()).group(1)

    page.goto(f"{live_server.url}/deployments/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", generated)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/password/?next=" in url)
    expect(page.get_by_test_id("password-change-required")).to_be_visible()
    page.goto(f"{live_server.url}/nodes/")  # nothing else opens meanwhile
    page.wait_for_url(lambda url: "/password/?next=" in url)

    page.fill("#id_old_password", generated)
    page.fill("#id_new_password1", "admin123")
    page.fill("#id_new_password2", "admin123")
    page.click(SUBMIT)
    expect(page.locator(".field-error").first).to_be_visible()  # too common, too short
    shot(page, "password-change-first-sign-in")

    new = "Quiet-Harbour-Lamp-31"
    page.fill("#id_old_password", generated)
    page.fill("#id_new_password1", new)
    page.fill("#id_new_password2", new)
    page.click(SUBMIT)
    page.wait_for_url("**/nodes/")
    expect(page.locator(".alert--ok")).to_contain_text("Password changed")
    page.goto(f"{live_server.url}/deployments/")
    expect(page).to_have_url(f"{live_server.url}/deployments/")
    assert not AccountState.objects.get().must_change_password
    assert AuditEntry.objects.filter(action="user.password_change", actor="admin").count() == 1


def test_a_viewer_on_an_operator_page_sees_the_roles(page, live_server):
    make_user("vera", "viewer")
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "vera")
    page.fill("#id_password", "pw-vera-123")
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)
    response = page.goto(f"{live_server.url}/audit/")
    assert response.status == 403
    reason = page.get_by_test_id("forbidden-reason")
    expect(reason).to_contain_text("This needs the operator role.")
    expect(reason).to_contain_text("signed in as vera with the viewer role")
    expect(page.locator("nav.nav")).to_be_visible()  # the console's own page
    shot(page, "forbidden-403")
