"""The main journeys in a real browser, with screenshots for the README (docs/screenshots/journey-*).

- An admin creates an enrollment token, a real (simulated-NPU) host agent enrols with it, its
  NPUs appear, and a deployment made from the catalog picker is placed and dispatched to it.
  A simulated node has no NPUs to run vLLM on: its agent simulates the engine (no process;
  workers/engine/simulated.py), so the replica goes starting -> loading -> ready labelled
  SIMULATED on the page, and the gateway never routes to it.
- On-call opens the incident queue, moves with j/k, opens with Enter, reads the diagnosis,
  acknowledges with `a`, adds a note and resolves.
- Phone (390 x 844) and dark mode: no horizontal scrolling on the main pages.

Run under `flock /tmp/npc-browser.lock`.
"""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import expect

from console.deployments.catalog import load_catalog
from console.deployments.engines import apply_report
from console.deployments.models import Replica
from console.deployments.reconcile import reconcile
from console.diagnosis.models import Incident
from console.inventory.models import Node
from tests.browser.conftest import SCREENSHOTS, shot
from tests.helpers import make_user
from tests.kit import make_deployment, make_node, make_replica, start_agent, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine"
PHONE = {"width": 390, "height": 844}


def sign_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")


def model_dir(root: Path, model_id: str) -> Path:
    """A model directory as the agent inspects it: the model's published config.json shapes
    (from the catalog) and a safetensors header declaring its parameters. The tensor bytes
    are not there — nothing here will load weights (the node is simulated)."""
    model = load_catalog().models[model_id]
    path = root / model.name
    path.mkdir(parents=True)
    config = {
        "architectures": [model.architecture],
        "hidden_size": model.hidden_size,
        "num_hidden_layers": model.num_hidden_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads,
        "max_position_embeddings": model.max_position_embeddings,
        "torch_dtype": model.torch_dtype,
    }
    (path / "config.json").write_text(json.dumps(config))
    header = json.dumps(
        {"weights": {"dtype": "BF16", "shape": [model.parameters], "data_offsets": [0, 0]}}
    ).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (path / "tokenizer.json").write_text("{}")
    return path


def no_horizontal_scroll(page) -> None:
    width = page.evaluate("document.scrollingElement.scrollWidth")
    inner = page.evaluate("window.innerWidth")
    assert width <= inner, f"{page.url}: {width}px wide in a {inner}px viewport"


def test_admin_enrols_a_node_and_deploys_from_the_catalog(
    page, live_server, console_worker, redis_url, tmp_path
):
    make_user("ada", "admin")
    sign_in(page, live_server, "ada")
    page.goto(f"{live_server.url}/enrollment/")
    page.fill("input[name=name]", "rack-a hosts")
    page.click("button:has-text('Create enrollment token')")
    token = page.locator("[data-testid=new-enrollment] code.mono").first.inner_text().strip()
    assert len(token) > 20
    shot(page, "journey-1-enrollment-token")

    agent = start_agent(
        redis_url,
        token,
        tmp_path,
        name="sim-journey",
        simulated=True,
        NPU_AGENT_ENGINE_START_TIMEOUT_S="20",
    )
    try:
        node = wait_for(
            lambda: Node.objects.filter(name="sim-journey", accelerators__isnull=False).first(),
            60,
            message="the node to enrol with its NPUs",
        )
        npus = node.accelerators.count()
        page.goto(f"{live_server.url}/nodes/")
        expect(page.locator("table").get_by_text("sim-journey")).to_be_visible()
        page.goto(f"{live_server.url}/nodes/sim-journey/")
        expect(page.locator("[data-testid=live-npu-row]")).to_have_count(npus)
        shot(page, "journey-2-node-enrolled")

        page.goto(f"{live_server.url}/catalog/")
        expect(page.locator("[data-testid=catalog-row]")).to_have_count(len(load_catalog().models))
        shot(page, "journey-catalog")
        page.goto(f"{live_server.url}/deployments/new")
        page.select_option("#pick-model", "deepseek-r1-distill-qwen-1.5b")
        page.select_option("#pick-card", "910b-64g")  # the simulated node replays a 910B1
        page.click("button:has-text('Fill the form')")
        expect(page.locator("[data-testid=catalog-preset]")).to_contain_text("TP 1")
        expect(page.locator("#model_path")).to_have_value("/models/DeepSeek-R1-Distill-Qwen-1.5B")
        expect(page.locator("#max_model_len")).to_have_value("32768")
        # The prefilled path does not exist on this host: the agent says so, by name.
        expect(page.locator("#check")).to_contain_text("does not exist", timeout=20_000)
        path = model_dir(tmp_path / "models", "deepseek-r1-distill-qwen-1.5b")
        page.fill("#model_path", str(path))
        page.dispatch_event("#model_path", "change")
        expect(page.locator("[data-testid=estimate]")).to_be_visible(timeout=20_000)
        expect(page.locator("#check [data-testid=estimate-steps]")).to_contain_text(
            "1,777,088,000 parameters x 2 B"
        )
        shot(page, "journey-3-deploy-from-catalog")
        page.click("button:has-text('Create deployment')")
        expect(page.locator("h1")).to_contain_text("r1-distill-qwen-1-5b-910b-64g", timeout=30_000)

        def ready():
            reconcile()  # what celery beat runs in production
            r = Replica.objects.select_related("node").first()
            return r if r and r.state == "ready" else None

        replica = wait_for(ready, 90, interval=1.0, message="the simulated replica to be ready")
        assert replica.node.name == "sim-journey" and replica.pid is None  # no process at all
        assert replica.state_reason.startswith("SIMULATED")
        page.reload()
        card = page.locator("[data-testid=replica]").first
        expect(card.get_by_role("link", name="sim-journey")).to_be_visible()
        expect(card.locator("[data-testid=replica-simulated]")).to_be_visible()
        expect(card.locator("[data-testid=timeline]")).to_contain_text("loading → ready")
        shot(page, "journey-4-deployment-dispatched")
    except AssertionError:
        print("--- page ---\n", page.locator("main").inner_text()[:3000])
        print("--- agent ---\n", agent.output()[-4000:])
        print("--- console worker ---\n", console_worker.output()[-4000:])
        raise
    finally:
        agent.stop()


def failed_replica(name: str, node: Node, log: str) -> Incident:
    """A replica whose engine report says it failed, with a real captured log tail: the
    console's own report path opens (and diagnoses) the incident."""
    replica = make_replica(make_deployment(name), node=node, state="starting", generation=1)
    apply_report(
        {
            "node": node.name,
            "replica_id": replica.pk,
            "generation": 1,
            "phase": "failed",
            "reason": "engine exited with code 1",
            "exit_code": 1,
            "at": datetime.now(UTC).isoformat(),
            "log_tail": (FIXTURES / log).read_text().splitlines()[-50:],  # as the agent sends
        },
        node=node.name,
    )
    return Incident.objects.get(replica=replica)


def test_on_call_works_an_incident_from_the_queue(page, live_server):
    make_user("otto", "operator")
    node = make_node("kp-oncall", npus=4)
    first = failed_replica("r1-7b", node, "err-model-missing.log")
    second = failed_replica("r1-14b", node, "err-port-in-use.log")
    sign_in(page, live_server, "otto")
    page.goto(f"{live_server.url}/incidents/")
    rows = page.locator("table[data-incident-queue] tbody tr")
    expect(rows).to_have_count(2)
    page.keyboard.press("j")
    expect(rows.nth(0)).to_have_attribute("aria-selected", "true")
    page.keyboard.press("j")
    expect(rows.nth(1)).to_have_attribute("aria-selected", "true")
    page.keyboard.press("k")
    expect(rows.nth(0)).to_have_attribute("aria-selected", "true")
    shot(page, "journey-5-incident-queue")
    target = rows.nth(0).get_attribute("id").removeprefix("incident-")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{live_server.url}/incidents/{target}/")
    incident = Incident.objects.get(pk=target)
    assert incident.pk in (first.pk, second.pk) and incident.diagnoses
    expect(page.locator("h1")).to_contain_text(incident.title)
    expect(page.locator("main")).to_contain_text(incident.diagnoses[0]["title"])
    shot(page, "journey-6-incident-diagnosis")

    page.goto(f"{live_server.url}/incidents/")
    page.keyboard.press("j")
    page.keyboard.press("a")  # acknowledge the selected incident
    expect(page.locator(f"#incident-{target} .badge").first).to_have_text("acknowledged")
    page.goto(f"{live_server.url}/incidents/{target}/")
    page.fill("#note-text", "Model directory was on the wrong mount; fixed in the host's fstab.")
    page.click("button:has-text('Add note')")
    expect(page.locator(".timeline")).to_contain_text("wrong mount")
    page.click("button:has-text('Resolve')")
    expect(page.locator("#incident-status")).to_have_text("resolved")
    shot(page, "journey-7-incident-resolved")
    incident.refresh_from_db()
    assert incident.status == "resolved" and incident.acknowledged_by


def test_phone_and_dark_mode_pages_fit_the_screen(browser, live_server):
    make_user("otto", "operator")
    node = make_node("kp-phone", npus=8)
    incident = failed_replica("r1-32b", node, "err-max-model-len.log")
    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True)
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        sign_in(page, live_server, "otto")
        for path, name in (
            ("/", "journey-phone-dashboard"),
            (f"/incidents/{incident.pk}/", "journey-phone-incident"),
            ("/incidents/", None),
            ("/nodes/", None),
            ("/deployments/", None),
            ("/deployments/new", None),
            ("/catalog/", None),
        ):
            page.goto(f"{live_server.url}{path}")
            no_horizontal_scroll(page)
            if name:  # what a phone shows first, not the whole scroll
                page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))
        page.goto(f"{live_server.url}/incidents/{incident.pk}/")
        page.click("[data-theme-toggle]")
        theme = page.evaluate("document.documentElement.dataset.theme || ''")
        assert theme == "dark", theme
        no_horizontal_scroll(page)
        page.screenshot(path=str(SCREENSHOTS / "journey-phone-incident-dark.png"))
    finally:
        context.close()
