"""Autoscaling on its deployment's page: turned on from the form (the count brought within the
bounds), a decision appearing live with its numbers, a bad bound refused with the field."""

from __future__ import annotations

import pytest

from console.deployments import autoscale
from console.deployments.models import Autoscaler, Deployment, ScalingAction
from tests.browser.conftest import shot
from tests.browser.test_login_and_inventory import login
from tests.helpers import make_user
from tests.kit import make_deployment, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_turn_on_autoscaling_and_watch_a_decision(page, live_server):
    make_user("ada", "operator")
    make_deployment("qwen", ports=[8100], desired_state="running", spec_version=1)
    login(page, live_server, "ada", "pw-ada-123")
    page.goto(f"{live_server.url}/deployments/qwen/")
    card = page.locator("[data-testid=autoscaler]")
    assert "off" in card.locator("h2").inner_text()
    card.locator("summary").click()
    form = page.locator("[data-testid=autoscaler-form]")
    form.locator("input[name=min_replicas]").fill("2")
    form.locator("input[name=max_replicas]").fill("4")
    form.locator("input[name=kv_target]").fill("70")
    form.get_by_role("button", name="Save autoscaling").click()
    page.wait_for_url("**/deployments/qwen/")
    assert "2–4 replicas" in card.locator("h2").inner_text()
    assert Deployment.objects.get(name="qwen").replicas == 2  # brought within the bounds
    assert "Brought within bounds" in page.locator("[data-testid=scaling-events]").inner_text()

    # a decision made by the beat shows up without a reload (the page's live refresh)
    policy = Autoscaler.objects.select_related("deployment").get(deployment__name="qwen")
    numbers = {"waiting_per_replica": 6.5, "kv_cache_percent": 41.0, "room": 2, "wanted": 3}
    autoscale.apply(policy, 3, ScalingAction.UP, "6.5 waiting per replica (target 2)", numbers)
    events = page.locator("[data-testid=scaling-events] tbody tr")
    wait_for(lambda: events.count() == 2, 20, message="the new decision on the live page")
    first = events.first.inner_text()
    assert "Scaled up" in first and "2 → 3" in first and "waiting_per_replica=6.5" in first
    shot(page, "deployment-autoscaling")

    # min above max: refused with the field named, nothing changed
    card.locator("summary").click()
    form.locator("input[name=min_replicas]").fill("5")
    form.locator("input[name=max_replicas]").fill("4")
    form.get_by_role("button", name="Save autoscaling").click()
    page.wait_for_url("**/deployments/qwen/")
    error = page.locator("[role=status] .alert--error")
    assert "min_replicas must not exceed max_replicas" in error.inner_text()
    assert Autoscaler.objects.get(deployment__name="qwen").max_replicas == 4
