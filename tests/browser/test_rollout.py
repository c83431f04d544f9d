"""A rolling update on its deployment's page: where it stands, and why it was rolled back."""

from __future__ import annotations

import pytest

from console.deployments.models import Rollout
from tests.browser.conftest import shot
from tests.browser.test_login_and_inventory import login
from tests.helpers import make_user
from tests.kit import make_deployment

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_rollout_line_says_where_it_stands_and_why_it_rolled_back(page, live_server):
    make_user("ada", "admin")
    dep = make_deployment("qwen", ports=[8100, 8101, 8102], spec_version=3, desired_state="running")
    first, second, _ = dep.replica_set.order_by("index")
    first.spec_version = 3
    first.save(update_fields=["spec_version"])
    second.state, second.state_reason = "draining", "draining: replaced by surge replica"
    second.save(update_fields=["state", "state_reason"])
    ro = Rollout.objects.create(
        deployment=dep,
        from_version=2,
        to_version=3,
        target_version=3,
        replaced=1,
        step_mode="surge",
        step_old=second,
    )
    login(page, live_server, "ada", "pw-ada-123")
    page.goto(f"{live_server.url}/deployments/qwen/")
    line = page.locator("[data-testid=rollout]")
    assert (
        line.inner_text() == "Rolling out spec v3: 1 of 3 replaced · now: one extra replica first"
    )
    shot(page, "deployment-rolling-update")

    why = "replica 1 crash-loops on spec v3: 5 crash(es) within 600s"
    Rollout.objects.filter(pk=ro.pk).update(
        state="rolled-back", target_version=2, reason=why, step_mode="", step_old=None
    )
    second.state, second.state_reason = "ready", "/v1/models lists qwen"
    second.save(update_fields=["state", "state_reason"])
    page.reload()
    assert line.inner_text() == f"Rolled back to v2: {why}"
    assert line.get_attribute("data-state") == "rolled-back"
    shot(page, "deployment-rolled-back")


def test_a_canary_is_promoted_from_its_line(page, live_server):
    from django.utils import timezone

    make_user("ada", "operator")
    dep = make_deployment(
        "qwen", ports=[8100, 8101], spec_version=3, good_version=2, desired_state="running"
    )
    canary = dep.replica_set.create(index=1000, state="ready", spec_version=3)
    Rollout.objects.create(
        deployment=dep,
        from_version=2,
        to_version=3,
        target_version=3,
        step_mode="surge",
        step_old=dep.replica_set.get(index=0),
        step_new=canary,
        step_verified_at=timezone.now(),
        canary_percent=10,
    )
    login(page, live_server, "ada", "pw-ada-123")
    page.goto(f"{live_server.url}/deployments/qwen/")
    line = page.locator("[data-testid=rollout]")
    assert "Canary: one replica on spec v3 takes 10% of requests" in line.inner_text()
    shot(page, "deployment-canary")
    line.get_by_role("button", name="Promote").click()
    page.wait_for_url("**/deployments/qwen/")
    assert Rollout.objects.get().promoted_at is not None
    assert "Rolling out spec v3" in page.locator("[data-testid=rollout]").inner_text()
