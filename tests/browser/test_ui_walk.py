"""A first-time user's walk through the pages (issue 16), in a real browser, with screenshots:

- a deployment is edited on its own page (the create form, filled in), saved through the
  API's update service (same checks, audit entry); a bad value is named under its field and
  changes nothing; secrets stay masked and kept;
- an API token limited to one model is made on the tokens page, shown once with a Copy
  button, and the gateway lets it call that model only;
- the model catalog fits a 1400 px wide window without scrolling sideways;
- a deployment with 9 replicas opens with a summary: counts by state, nodes, NPUs in use,
  the last failure; the healthy replicas' cards start collapsed.

Run under `flock /tmp/npc-browser.lock`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.accounts.models import ApiToken, AuditEntry
from console.accounts.services import Actor
from console.deployments import services
from console.deployments.models import Deployment, NpuAllocation, Replica, ReplicaEvent
from console.deployments.schemas import DeploymentIn
from console.inventory.models import Accelerator
from tests.browser.conftest import shot
from tests.console.deployments.conftest import QWEN_7B_LIKE
from tests.helpers import make_user
from tests.kit import FakeEngine, make_deployment, make_node, make_replica

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def sign_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


@pytest.fixture
def fake_inspect(monkeypatch):
    """The agent's model inspection answered in-process (the live server runs in this
    process): a Qwen2-7B-like config."""
    monkeypatch.setattr(
        "console.deployments.services.inspect_model",
        lambda node, path, timeout=20.0: dict(QWEN_7B_LIKE, path=path),
    )


def test_edit_a_deployment_on_its_page(page, live_server, fake_inspect):
    otto = make_user("otto", "operator")
    make_node("kp-01", npus=8)
    services.create_deployment(
        actor=Actor(user=otto, name="otto"),
        payload=DeploymentIn(
            name="r1-7b",
            model_path="/models/r1-7b",
            served_model_name="r1-7b",
            max_model_len=8192,
            extra_env={"HF_TOKEN_X": "hf_do-not-show", "VLLM_LOGGING_LEVEL": "INFO"},
            preflight_override="api-only field, kept by the form",
        ),
    )
    sign_in(page, live_server, "otto")
    page.goto(f"{live_server.url}/deployments/r1-7b/")
    page.click("[data-testid=edit-link]")
    page.wait_for_url("**/deployments/r1-7b/edit")
    expect(page.locator("#name")).to_have_attribute("readonly", "")
    env = page.locator("#extra_env").input_value()
    assert "HF_TOKEN_X=***" in env and "hf_do-not-show" not in page.content()
    expect(page.locator("#max_model_len")).to_have_value("8192")

    page.fill("#max_model_len", "4096")
    page.fill("#model_label", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B")
    shot(page, "deployment-edit")
    page.click("[data-testid=save-edit]")
    page.wait_for_url("**/deployments/r1-7b/")
    expect(page.locator("[data-testid=engine-flags]")).to_contain_text("--max-model-len 4096")
    dep = Deployment.objects.get(name="r1-7b")
    assert (dep.max_model_len, dep.spec_version) == (4096, 2)
    assert dep.model_label == "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"
    assert dep.extra_env["HF_TOKEN_X"] == "hf_do-not-show"  # *** sent back kept the secret
    assert dep.preflight_override == "api-only field, kept by the form"
    entry = AuditEntry.objects.get(action="deployment.update", object_repr__contains="r1-7b")
    assert entry.after["spec"]["max_model_len"] == 4096 and entry.actor == "otto"
    assert "hf_do-not-show" not in str(entry.after)

    # a value the API refuses: named under its field, nothing changed, no audit entry
    page.click("[data-testid=edit-link]")
    page.fill("#tensor_parallel_size", "2")
    page.click("[data-testid=save-edit]")
    error = page.locator(".field:has(#tensor_parallel_size) [data-testid=field-error]")
    expect(error).to_be_visible()
    expect(page.locator("#tensor_parallel_size")).to_have_value("2")  # the input is kept
    shot(page, "deployment-edit-error")
    dep.refresh_from_db()
    assert (dep.tensor_parallel_size, dep.spec_version, dep.max_model_len) == (1, 2, 4096)
    assert AuditEntry.objects.filter(action="deployment.update").count() == 1


def test_viewers_get_no_edit_page(page, live_server):
    make_user("vera", "viewer")
    make_deployment("r1-7b")
    sign_in(page, live_server, "vera")
    page.goto(f"{live_server.url}/deployments/r1-7b/")
    expect(page.locator("[data-testid=edit-link]")).to_have_count(0)
    response = page.goto(f"{live_server.url}/deployments/r1-7b/edit")
    assert response is not None and response.status == 403


def test_a_token_limited_to_one_model(page, live_server):
    from starlette.testclient import TestClient

    from console.gateway import auth
    from console.gateway.app import app

    make_user("otto", "operator")
    sign_in(page, live_server, "otto")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page.goto(f"{live_server.url}/tokens/")
    page.fill("#token-name", "only-a")
    page.fill("#token-models", "model-a")
    page.select_option("#token-expires", "30")
    page.click("text=Create token")
    value = page.locator("[data-testid=new-token-value]").inner_text().strip()
    assert value.startswith("npc_")
    page.click("[data-testid=copy-token]")
    expect(page.locator("[data-testid=copy-token]")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == value
    shot(page, "token-created")
    page.reload()  # shown once
    expect(page.locator("[data-testid=new-token]")).to_have_count(0)
    token = ApiToken.objects.get(name="only-a")
    assert token.allowed_models == ["model-a"]
    assert abs(token.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=5)

    auth.forget()
    with FakeEngine(name="a") as a, FakeEngine(name="b") as b, TestClient(app) as gw:
        make_deployment("dep-a", served_model_name="model-a", device="cpu", ports=[a.port])
        make_deployment("dep-b", served_model_name="model-b", device="cpu", ports=[b.port])
        headers = {"Authorization": f"Bearer {value}"}
        listed = gw.get("/v1/models", headers=headers).json()
        assert [m["id"] for m in listed["data"]] == ["model-a"]
        ok = gw.post("/v1/completions", headers=headers, json={"model": "model-a", "prompt": "x"})
        assert ok.status_code == 200, ok.text
        denied = gw.post(
            "/v1/completions", headers=headers, json={"model": "model-b", "prompt": "x"}
        )
        assert denied.status_code == 403 and b.requests == []
        assert denied.json()["error"]["code"] == "model_not_allowed"


def test_the_catalog_fits_1400_px(page, live_server):
    make_user("otto", "operator")
    sign_in(page, live_server, "otto")
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{live_server.url}/catalog/")
    table = page.locator("[data-testid=catalog-table]")
    expect(table).to_be_visible()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 1400
    box = table.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 1400
    wrap_scrolls = table.evaluate("t => t.parentElement.scrollWidth > t.parentElement.clientWidth")
    assert not wrap_scrolls  # nor inside its scrolling wrapper
    shot(page, "catalog-1400")


def _nine_replicas() -> Deployment:
    """9 replicas over three 8-NPU nodes: 4 ready, 2 starting, 2 failed, 1 stopped."""
    dep = make_deployment("big", replicas=9, desired_state="running", npus_per_replica=2)
    nodes = [make_node(f"kp-{i:02d}", npus=8) for i in range(3)]
    states = ["ready"] * 4 + ["starting", "loading", "failed", "crash-loop", "stopped"]
    now = timezone.now()
    for i, state in enumerate(states):
        node = None if state == "stopped" else nodes[i % 3]
        at = now - timedelta(minutes=10 - i)
        r = make_replica(
            dep, node=node, state=state, state_reason=f"replica {i} is {state}", state_changed_at=at
        )
        if node is not None:
            for chip in Accelerator.objects.filter(node=node, allocation__isnull=True)[:2]:
                NpuAllocation.objects.create(accelerator=chip, replica=r)
        if state in ("failed", "crash-loop"):
            ReplicaEvent.objects.create(
                replica=r,
                at=at,
                from_state="ready",
                to_state=state,
                reason=f"engine exited (replica {i})",
            )
    return dep


def test_a_long_deployment_page_opens_with_a_summary(page, live_server):
    make_user("otto", "operator")
    _nine_replicas()
    sign_in(page, live_server, "otto")
    page.goto(f"{live_server.url}/deployments/big/")
    summary = page.locator("[data-testid=replica-summary]")
    expect(summary).to_be_visible()
    counts = {
        k: page.locator(f"[data-testid=summary-{k}]").inner_text()
        for k in ("ready", "starting", "failed", "stopped", "nodes", "npus")
    }
    assert counts == {
        "ready": "4",
        "starting": "2",
        "failed": "2",
        "stopped": "1",
        "nodes": "3",
        "npus": "16",
    }
    last = page.locator("[data-testid=last-failure]")
    expect(last).to_contain_text("replica 7")  # the later of the two failures
    expect(last).to_contain_text("crash-loop")
    expect(last).to_contain_text("engine exited (replica 7)")
    cards = page.locator("[data-testid=replica]")
    expect(cards).to_have_count(9)
    # the failing cards are open, the others one line each
    open_ = [c.get_attribute("open") is not None for c in cards.all()]
    assert open_ == [False] * 6 + [True, True, False]
    shot(page, "deployment-summary")

    # the live refresh (every 3 s) brings a fresh summary; a card the user opened stays open
    first = cards.nth(0)
    first.locator("summary").click()
    expect(first.locator("[data-testid=timeline]")).to_be_visible()
    Replica.objects.filter(deployment__name="big", index=4).update(state="ready")
    page.evaluate("document.getElementById('live').dataset.old = 'yes'")
    expect(page.locator("#live[data-old]")).to_have_count(0, timeout=10_000)  # swapped again
    expect(page.locator("[data-testid=summary-ready]")).to_have_text("5")
    expect(page.locator("[data-testid=replica-summary]")).to_have_count(1)
    expect(page.locator("[data-testid=replica]").nth(0)).to_have_attribute("open", "")
    expect(page.locator("[data-testid=replica]").nth(1)).not_to_have_attribute("open", "")
