"""In a real browser: start a benchmark from the deployment's page, watch it progress live,
see its results charted, compare it with an earlier run (fake OpenAI server as the engine,
a real console worker running the load)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from console.benchmarks.models import BenchmarkRun
from console.benchmarks.services import engine_snapshot
from tests.browser.conftest import shot
from tests.console.benchmarks.conftest import BENCH
from tests.helpers import make_user
from tests.kit import FakeEngine, make_deployment

pytestmark = [pytest.mark.browser, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def earlier_run(dep, days: int, seqs: int, rps: float, ttft: float) -> BenchmarkRun:
    n = 12
    return BenchmarkRun.objects.create(
        deployment=dep,
        created_at=timezone.now() - timedelta(days=days),
        prompt_tokens=16,
        output_tokens=8,
        concurrency=3,
        duration_s=n,
        status="succeeded",
        requests=int(rps * n),
        req_per_s=rps,
        output_tokens_per_s=rps * 8,
        ttft_p50_ms=ttft,
        ttft_p99_ms=ttft * 1.8,
        itl_p50_ms=100.0,
        itl_p99_ms=130.0,
        e2e_p50_ms=ttft + 700,
        e2e_p99_ms=ttft * 1.8 + 900,
        engine_settings={**engine_snapshot(dep), "max_num_seqs": seqs},
        timeline={
            "t": list(range(n)),
            "output_tokens": [round(rps * 8 * (0.9 + 0.02 * (i % 5))) for i in range(n)],
            "ttft_p50_ms": [ttft + 5 * (i % 3) for i in range(n)],
        },
    )


def test_start_watch_chart_and_compare(page, live_server, console_worker):
    make_user("ada", "admin")
    with FakeEngine(ttft_s=0.05, itl_s=0.1) as engine:
        dep = make_deployment("tiny", ports=[engine.port], **{**BENCH, "max_num_seqs": 16})
        earlier_run(dep, 14, seqs=4, rps=2.1, ttft=95.0)
        before = earlier_run(dep, 7, seqs=4, rps=2.3, ttft=90.0)

        page.goto(f"{live_server.url}/login/")
        page.fill("#id_username", "ada")
        page.fill("#id_password", "pw-ada-123")
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/")
        page.goto(f"{live_server.url}/deployments/tiny/")
        page.click("[data-testid=benchmarks-link]")
        expect(page.locator("[data-testid=trend] .chart canvas").first).to_be_visible()
        shot(page, "benchmark-list")

        page.fill("#prompt_tokens", "16")
        page.fill("#output_tokens", "8")
        page.fill("#load_value", "3")
        page.fill("#duration_s", "6")
        page.click("text=Run benchmark")
        page.wait_for_url(f"{live_server.url}/benchmarks/*/")
        live = page.locator("[data-testid=run-live]")
        expect(live).to_have_attribute("data-status", "running", timeout=15_000)
        expect(page.locator(".bench-chart canvas").first).to_be_visible(timeout=10_000)
        shot(page, "benchmark-run-live")
        expect(live).to_have_attribute("data-status", "succeeded", timeout=30_000)
        expect(page.locator("[data-metric=req_per_s]")).not_to_have_text("—")
        expect(page.locator("[data-testid=charts] canvas")).to_have_count(4)
        shot(page, "benchmark-run")

        run = BenchmarkRun.objects.exclude(pk__lte=before.pk).get()
        assert run.requests == len(engine.requests) > 0
        assert run.engine_settings["max_num_seqs"] == 16

    page.goto(f"{live_server.url}/benchmarks/?deployment=tiny")
    page.check(f"input[name=a][value='{before.pk}']")
    page.check(f"input[name=b][value='{run.pk}']")
    page.click("text=Compare A and B")
    expect(page.locator("[data-testid=changed-count]")).to_have_text("1 changed")
    expect(page.locator("tr[data-changed]")).to_contain_text("max_num_seqs")
    expect(page.locator(".bench-chart canvas")).to_have_count(2)
    shot(page, "benchmark-compare")
