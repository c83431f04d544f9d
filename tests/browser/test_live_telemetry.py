"""In a real browser: the node page and the dashboard heatmap update without a reload."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from playwright.sync_api import expect

from console.accounts.services import Actor
from console.hot import get_redis
from console.inventory.enrollment import create_enrollment_token
from console.inventory.heartbeats import ingest_heartbeat
from tests.browser.conftest import shot
from tests.helpers import make_user
from tests.node_support import enroll_node

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def beat(token: str, aicore: float, temp: float = 48.0, health: str = "OK") -> dict:
    return {
        "node": "kp-live",
        "enroll_token": token,
        "sent_at": datetime.now(UTC).isoformat(),
        "host": {"hostname": "kp-live", "arch": "aarch64", "cpu_model": "Kunpeng 920"},
        "chips": [
            {
                "npu_id": i,
                "chip_id": 0,
                "name": "910B3",
                "health": health if i == 3 else "OK",
                "aicore_percent": aicore if i == 0 else 5.0,
                "hbm_used_mb": 20_000 + i,
                "hbm_total_mb": 65536,
                "temperature_c": temp if i == 3 else 45.0,
                "power_w": 100.0,
            }
            for i in range(8)
        ],
        "processes": [
            {"npu_id": 0, "chip_id": 0, "pid": 4242, "name": "python3", "memory_mb": 19000}
        ],
    }


@pytest.fixture
def clean_hot(redis_url):
    r = get_redis()
    for key in r.scan_iter("npc:*"):
        r.delete(key)
    yield
    for key in r.scan_iter("npc:*"):
        r.delete(key)


def sign_in(page, live_server):
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", "pw-ada-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def test_node_page_updates_within_seconds_of_a_beat(page, live_server, clean_hot):
    admin = make_user("ada", "admin")
    token, raw = create_enrollment_token(actor=Actor(user=admin, name="ada"), name="t")
    enroll_node("kp-live", token)
    ingest_heartbeat(beat(raw, aicore=11.0), node="kp-live")
    sign_in(page, live_server)
    page.goto(f"{live_server.url}/nodes/kp-live/")
    first = page.locator("[data-testid=live-npu-row]").first.locator("[data-testid=aicore]")
    expect(first).to_have_text("11.0")
    ingest_heartbeat(beat(raw, aicore=77.0, temp=91.0, health="Warning"), node="kp-live")
    expect(first).to_have_text("77.0", timeout=8_000)  # the 5 s poll, no reload
    alerts = page.locator("[data-testid=npu-alert]")
    expect(alerts.first).to_contain_text("health Warning")
    expect(alerts.nth(1)).to_contain_text("temperature 91 °C")
    shot(page, "node-live")

    page.goto(f"{live_server.url}/")
    expect(page.locator("[data-testid=live-alerts]")).to_have_text("1")
    expect(page.locator("[data-testid=heatmap] .heatmap-cell--crit")).to_have_count(1)
    shot(page, "dashboard-heatmap")
