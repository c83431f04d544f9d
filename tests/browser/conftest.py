"""Playwright driving Debian's chromium (never `playwright install`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("NPU_REQUIRE_BROWSER"):
            pytest.fail(f"chromium not found at {CHROMIUM} and NPU_REQUIRE_BROWSER is set")
        pytest.skip("chromium is not installed (apt install chromium); .ci/run installs it")
    # Playwright's sync API runs an event loop in this thread; the ORM calls made by fixtures
    # are still plain synchronous calls, so Django's async guard does not apply here.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "1"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


def shot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
