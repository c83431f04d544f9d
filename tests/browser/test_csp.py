"""In a real browser, under the console's Content-Security-Policy (no inline script or style,
no eval): every main page loads with no policy violation and no console error; confirm
dialogs still ask (and a "no" sends nothing); the log page's Pause stops its poll.

Run under `flock /tmp/npc-browser.lock`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.accounts.services import Actor, create_token
from console.benchmarks.models import BenchmarkRun
from console.deployments.models import Deployment
from console.diagnosis.models import Incident
from console.inventory.enrollment import issue_enrollment_token
from console.logs import services as logs
from tests.browser.conftest import shot
from tests.console.telemetry.builders import sample
from tests.helpers import make_user
from tests.kit import make_deployment, make_node, make_replica, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Collected before any page script runs (an init script is not subject to the page's policy).
WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.__csp.push(e.violatedDirective + ' blocked ' + (e.blockedURI || 'inline') + ' at ' +
                    (e.sourceFile || location.pathname) + ':' + e.lineNumber);
});
"""


@pytest.fixture
def watched(page):
    """The page, and the problems seen on it: policy violations, console errors, page errors."""
    problems: list[str] = []
    page.add_init_script(WATCH)
    page.on(
        "console",  # a failed load is reported below with its address
        lambda m: (
            m.type == "error"
            and not m.text.startswith("Failed to load resource")
            and problems.append(f"console: {m.text}")
        ),
    )
    page.on(  # the admin and API docs pages link no icon: the browser's own /favicon.ico try
        "response",
        lambda r: (
            r.status >= 400
            and not r.url.endswith("/favicon.ico")
            and problems.append(f"HTTP {r.status}: {r.url}")
        ),
    )
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    return page, problems


def sign_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-123")
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)


def seed() -> dict:
    """One of everything the main pages show."""
    ada = make_user("ada", "admin")
    ada.is_staff = ada.is_superuser = True
    ada.save(update_fields=["is_staff", "is_superuser"])
    actor = Actor(user=ada, name="ada")
    node = make_node("kp-910b-01", npus=2, labels={"zone": "az1"})
    now = timezone.now()
    for i in range(30):  # a chart with data (uPlot draws it)
        sample(node, now - timedelta(seconds=10 * i), aicore_percent=float(i))
    dep = make_deployment("r1-7b", model_path="/models/r1-7b", served_model_name="r1-7b")
    Deployment.objects.filter(pk=dep.pk).update(desired_state="running")
    replica = make_replica(dep, node=node, state="ready")
    logs.ingest_batch(
        payload={
            "node": node.name,
            "replica_id": replica.pk,
            "generation": 1,
            "run": 1,
            "file": "gen1-run1.log",
            "first_line_no": 1,
            "lines": ["INFO starting", "WARNING slow", "ERROR boom"],
        }
    )
    incident = Incident.objects.create(
        category="engine-crash",
        severity="warning",
        title="Engine died",
        fingerprint="fp:csp",
        node=node,
        diagnoses=[],
        evidence=[],
    )
    run = BenchmarkRun.objects.create(
        deployment=dep,
        prompt_tokens=16,
        output_tokens=8,
        concurrency=2,
        duration_s=3,
        status="succeeded",
        timeline={"t": [0, 1, 2], "output_tokens": [10, 12, 11]},
    )
    create_token(actor=actor, name="ci")
    issue_enrollment_token(actor=actor, name="rack-a")
    return {"node": node, "dep": dep, "replica": replica, "incident": incident, "run": run}


def test_every_main_page_loads_without_a_policy_violation(watched, live_server):
    page, problems = watched
    rows = seed()
    accelerator = rows["node"].accelerators.order_by("npu_id").first()
    paths = [
        "/",
        "/nodes/",
        "/nodes/kp-910b-01/",
        "/nodes/kp-910b-01/doctor/",
        f"/accelerators/{accelerator.pk}/journal/",
        "/deployments/",
        "/deployments/r1-7b/",
        "/deployments/r1-7b/edit",
        "/deployments/new",
        "/catalog/",
        "/incidents/",
        f"/incidents/{rows['incident'].pk}/",
        "/diagnose/",
        "/diagnose/rules/",
        "/benchmarks/",
        f"/benchmarks/{rows['run'].pk}/",
        "/tokens/",
        "/password/",
        "/incidents/webhooks/",
        "/audit/",
        "/enrollment/",
        f"/replicas/{rows['replica'].pk}/logs/",
        "/gateway/",
        "/api/v1/docs",
        "/admin/",
        "/admin/auth/user/",
    ]
    shots = {
        "/nodes/kp-910b-01/": "csp-node-detail",
        f"/replicas/{rows['replica'].pk}/logs/": "csp-replica-log",
        "/enrollment/": "csp-enrollment",
    }
    sign_in(page, live_server, "ada")
    seen = {}
    for path in paths:
        response = page.goto(f"{live_server.url}{path}")
        assert response.status == 200, (path, response.status)
        policy = response.header_value("content-security-policy") or ""
        assert "script-src 'self'" in policy and "unsafe" not in policy, (path, policy)
        page.wait_for_load_state("load")
        # htmx has started (it reads its config, and would add its <style>, at this point)
        if path.startswith(("/api/", "/admin/")):
            page.wait_for_timeout(300)  # their own scripts render after load
        else:
            wait_for(lambda: page.evaluate("!!(window.htmx && document.body)"), message=path)
        seen[path] = page.evaluate("window.__csp.slice()")
        if path in shots:  # pages whose style="" attributes became classes: look at them
            shot(page, shots[path])
    violations = {p: v for p, v in seen.items() if v}
    assert not violations, violations
    assert not problems, problems
    # htmx obeyed its meta config: no injected indicator style
    page.goto(f"{live_server.url}/")
    assert page.evaluate("document.querySelectorAll('style').length") == 0


def test_confirm_dialogs_ask_and_a_no_sends_nothing(watched, live_server):
    page, problems = watched
    seed()
    Deployment.objects.filter(name="r1-7b").update(desired_state="running")
    sign_in(page, live_server, "ada")
    page.goto(f"{live_server.url}/deployments/r1-7b/")
    asked: list[str] = []

    def answer(dialog, accept: bool):
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", lambda d: answer(d, False))
    page.get_by_role("button", name="Stop").click()
    wait_for(lambda: asked, message="the Stop button asked nothing")
    assert asked == ["Stop every replica of r1-7b?"]
    page.wait_for_timeout(300)  # a submit, had there been one, would have left by now
    assert Deployment.objects.get(name="r1-7b").desired_state == "running"

    page.once("dialog", lambda d: answer(d, True))
    page.get_by_role("button", name="Stop").click()
    wait_for(
        lambda: Deployment.objects.get(name="r1-7b").desired_state == "stopped",
        message="the accepted Stop did not stop",
    )
    assert len(asked) == 2
    # the enrollment page's Revoke asks too, naming the token (HTML-escaped, not JS-quoted)
    page.goto(f"{live_server.url}/enrollment/")
    page.once("dialog", lambda d: answer(d, False))
    page.get_by_role("button", name="Revoke").first.click()
    wait_for(lambda: len(asked) == 3, message="Revoke asked nothing")
    assert asked[2].startswith("Revoke rack-a?")
    assert not problems, problems


def test_the_log_page_polls_pauses_and_resumes(watched, live_server):
    page, problems = watched
    rows = seed()
    replica = rows["replica"]
    sign_in(page, live_server, "ada")
    polls: list[str] = []
    page.on("request", lambda r: "/logs/?" in r.url and polls.append(r.url))
    page.goto(f"{live_server.url}/replicas/{replica.pk}/logs/")
    lines = page.locator("[data-testid=log-lines]")
    expect(lines).to_contain_text("ERROR boom")

    def ship(first: int, text: str) -> None:
        logs.ingest_batch(
            payload={
                "node": "kp-910b-01",
                "replica_id": replica.pk,
                "generation": 1,
                "run": 1,
                "file": "gen1-run1.log",
                "first_line_no": first,
                "lines": [text],
            }
        )

    ship(4, "INFO line four")
    expect(lines).to_contain_text("INFO line four")  # the poll brought it in

    pause = page.get_by_role("button", name="Pause")
    pause.click()
    expect(page.get_by_role("button", name="Resume")).to_have_attribute("aria-pressed", "true")
    page.wait_for_timeout(200)  # a poll already in flight when Pause was pressed lands
    before = len(polls)
    ship(5, "INFO line five")
    page.wait_for_timeout(2500)  # 2.5 poll intervals: a running poll would have asked twice
    assert len(polls) == before, polls[before:]
    expect(lines).not_to_contain_text("line five")

    page.get_by_role("button", name="Resume").click()
    expect(lines).to_contain_text("INFO line five")
    assert not problems, problems
