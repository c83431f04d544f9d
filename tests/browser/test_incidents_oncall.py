"""In a real browser, on-call's view of incidents (issue 16): five failing replicas of one
deployment are five rows, each naming its replica; an unmatched failure shows the lines it was
opened from; the timeline is a list of entries — time, actor, kind, then the text wrapped in
its own column with its line breaks kept, a long unbroken token never widening the page; the
NPU journal lists the incidents of the NPU. Screenshots: docs/screenshots/incident-*.png."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from playwright.sync_api import expect

from console.deployments.models import NpuAllocation
from console.diagnosis import incidents
from console.inventory.models import Accelerator
from tests.browser.conftest import shot
from tests.helpers import make_user
from tests.kit import make_deployment, make_node, make_replica
from workers.contracts import EngineReport

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TAIL = [
    "INFO 09:14:02 [model_runner] loading weights shard 3/4",
    "INFO 09:14:07 [model_runner] loading weights shard 4/4",
    "zzz device side: something this console has no rule for",
    "INFO 09:14:09 [engine] worker 0 is gone, shutting down",
]
TOKEN = "x" * 40 + "/var/log/npu/slog/device-0/device-0_20260104091409123.log" + "y" * 60
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$")
NOTE = f"Checked the host.\nnpu-smi info -t health -i 0 says OK.\n\nLog kept at {TOKEN}"


def _login(page, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def _report(replica, **fields) -> EngineReport:
    values = {
        "node": replica.node.name,
        "replica_id": replica.pk,
        "generation": 1,
        "phase": "failed",
        "reason": "engine exited with code 1",
        "exit_code": 1,
        "at": datetime.now(UTC),
        "log_tail": TAIL,
    }
    values.update(fields)
    return EngineReport(**values)


def _five_failing_replicas():
    node = make_node("ascend-a", npus=5)
    dep = make_deployment("chat", replicas=5)
    replicas = []
    for chip in Accelerator.objects.filter(node=node).order_by("npu_id"):
        replica = make_replica(dep, node=node, state="crash-loop")
        NpuAllocation.objects.create(replica=replica, accelerator=chip)
        incidents.open_incident_for_replica(replica, _report(replica))
        replicas.append(replica)
    return replicas


def test_on_call_reads_incidents_per_replica_with_a_readable_timeline(page, live_server):
    make_user("otto", "operator")
    replicas = _five_failing_replicas()
    third = replicas[2]
    # the same replica again, twice: folded, each repeat on the timeline; then it crash-loops
    incidents.open_incident_for_replica(third, _report(third, reason="exited with code 1 again"))
    incidents.open_incident_for_replica(
        third, _report(third, phase="crash-loop", reason="gave up after 5 quick restarts")
    )
    base = live_server.url
    _login(page, base, "otto")

    page.goto(f"{base}/incidents/")
    rows = page.locator("#incidents tbody tr")
    expect(rows).to_have_count(5)
    for r in replicas:
        expect(rows.filter(has_text=f"chat replica {r.index} on ascend-a")).to_have_count(1)
    shot(page, "incident-queue-per-replica")

    row = rows.filter(has_text="chat replica 2 on ascend-a")
    expect(row.locator("td").nth(5)).to_have_text("3")
    row.locator("a").first.click()
    expect(page.locator("h2#evidence")).to_have_text("The lines it was opened from")
    for line in TAIL:
        expect(page.locator("pre.log").first).to_contain_text(line)

    page.get_by_role("button", name="Acknowledge").click()
    page.fill("#note-text", NOTE)
    page.get_by_role("button", name="Add note").click()
    timeline = page.get_by_test_id("incident-timeline")
    entries = timeline.locator("li.incident-entry")
    kinds = entries.evaluate_all("els => els.map(e => e.dataset.kind)")
    assert kinds == ["opened", "system", "repeat", "repeat", "action", "note"]
    for i in range(len(kinds)):  # each entry: its time, who, what kind, then the text
        entry = entries.nth(i)
        expect(entry.locator("time")).to_have_text(STAMP)
        expect(entry.locator(".incident-entry-head strong")).not_to_be_empty()
        expect(entry.locator(".incident-entry-head .badge")).to_have_text(kinds[i])

    last = entries.last
    note = last.locator(".incident-entry-text")
    expect(last.locator(".incident-entry-head strong")).to_have_text("otto")
    geometry = note.evaluate(
        """el => ({
            text: el.innerText,
            width: el.getBoundingClientRect().width,
            left: el.getBoundingClientRect().left,
            timeRight: el.closest('li').querySelector('time').getBoundingClientRect().right,
            overflow: el.scrollWidth - el.clientWidth,
            pageOverflow: document.documentElement.scrollWidth - window.innerWidth,
            lines: Math.round(el.getBoundingClientRect().height
                              / parseFloat(getComputedStyle(el).lineHeight)),
        })"""
    )
    assert geometry["text"].split("\n")[:3] == NOTE.split("\n")[:3]  # line breaks kept
    assert geometry["width"] > 400, geometry  # its own wide column, not squeezed under the time
    assert geometry["left"] > geometry["timeRight"], geometry  # beside the time, not under it
    assert geometry["overflow"] <= 0 and geometry["pageOverflow"] <= 0, geometry  # wrapped
    assert geometry["lines"] >= 5, geometry  # 4 lines typed, the long token wrapped
    timeline.scroll_into_view_if_needed()
    shot(page, "incident-timeline")

    # the NPU that replica held: its journal lists the incident
    page.locator("[data-testid=incident-npus] a").first.click()
    expect(page.locator("#npu-incidents tbody tr")).to_have_count(1)
    expect(page.locator("#npu-incidents")).to_contain_text("chat replica 2 on ascend-a")
    page.fill("input[name=text]", "reseated the card after incident 3")
    page.get_by_role("button", name="Add note").click()
    expect(page.locator("#journal")).to_contain_text("reseated the card after incident 3")
    shot(page, "incident-npu-journal")
