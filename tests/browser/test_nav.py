"""The top bar fits a laptop screen; the settings menu opens, lists its links and closes."""

from __future__ import annotations

import pytest

from tests.browser.conftest import shot
from tests.browser.test_login_and_inventory import login
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [1280, 390])
def test_top_bar_fits_and_settings_menu_works(page, live_server, width):
    make_user("ada", "admin")
    page.set_viewport_size({"width": width, "height": 800})
    login(page, live_server, "ada", "pw-ada-123")
    page.wait_for_url(f"{live_server.url}/nodes/")
    page.goto(f"{live_server.url}/gateway/")
    nav = page.locator("nav.nav")
    if width >= 1280:  # every main link visible, no sideways scrolling of the nav
        assert nav.evaluate("n => n.scrollWidth <= n.clientWidth + 1")
    assert page.evaluate("document.scrollingElement.scrollWidth <= innerWidth")
    menu = page.locator("details.menu")
    menu.locator("summary").click()
    items = menu.locator(".menu__items a")
    assert items.all_inner_texts() == [
        "API tokens",
        "Incident webhooks",
        "Audit log",
        "API docs",
        "Enrollment",
        "Admin site",
    ]
    assert items.first.is_visible()
    shot(page, f"gateway-{width}")
    page.mouse.click(width - 5, 790)  # a click elsewhere closes it
    assert not items.first.is_visible()
    menu.locator("summary").click()
    page.get_by_role("menuitem", name="API tokens").click()
    page.wait_for_url("**/tokens/")
    assert page.locator("details.menu summary[aria-current=page]").count() == 1
