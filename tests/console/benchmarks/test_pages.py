"""Benchmark pages: start form (422 naming the field), live run page, list trend, compare."""

from __future__ import annotations

from console.benchmarks import services
from console.benchmarks.models import BenchmarkRun
from console.deployments.models import Deployment

FORM = {
    "deployment": "tiny",
    "prompt_tokens": "16",
    "output_tokens": "4",
    "load": "concurrency",
    "load_value": "2",
    "duration_s": "1",
}


def test_deployment_page_links_to_its_benchmarks(viewer_client, deployment):
    page = viewer_client.get("/deployments/tiny/").content.decode()
    assert "/benchmarks/?deployment=tiny" in page


def test_operator_sees_the_start_form_viewer_does_not(operator_client, viewer_client, deployment):
    assert (
        'data-testid="start-form"'
        in operator_client.get("/benchmarks/?deployment=tiny").content.decode()
    )
    page = viewer_client.get("/benchmarks/?deployment=tiny")
    assert page.status_code == 200 and 'data-testid="start-form"' not in page.content.decode()
    assert viewer_client.post("/benchmarks/new", FORM).status_code == 403


def test_form_errors_are_422_naming_the_field_and_keep_the_input(operator_client, deployment):
    resp = operator_client.post("/benchmarks/new", {**FORM, "duration_s": "0", "seed": "42"})
    assert resp.status_code == 422
    body = resp.content.decode()
    assert "duration_s" in body and 'value="42"' in body
    resp = operator_client.post("/benchmarks/new", {**FORM, "load_value": ""})
    assert resp.status_code == 422 and "concurrency" in resp.content.decode()
    assert not BenchmarkRun.objects.exists()


def test_start_from_the_form_then_the_run_page_polls_until_done(operator_client, deployment):
    form = {**FORM, "load": "request_rate", "load_value": "20", "seed": "1"}
    resp = operator_client.post("/benchmarks/new", form)
    run = BenchmarkRun.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/benchmarks/{run.pk}/"
    assert run.request_rate == 20.0 and run.concurrency is None and run.seed == 1
    page = operator_client.get(f"/benchmarks/{run.pk}/").content.decode()
    assert 'hx-trigger="every 1s' in page and "queued" in page and "Cancel" in page
    services.execute_run(run.pk)
    live = operator_client.get(f"/benchmarks/{run.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert "hx-trigger" not in live  # a finished run stops the poll
    assert 'data-testid="results"' in live and 'data-metric="ttft_p99_ms"' in live
    assert 'class="chart bench-chart"' in live and "<html" not in live


def test_list_charts_runs_over_time_and_offers_compare(viewer_client, deployment):
    for seqs, rps in ((4, 10.0), (16, 14.0)):
        BenchmarkRun.objects.create(
            deployment=deployment,
            prompt_tokens=16,
            output_tokens=4,
            concurrency=4,
            duration_s=5,
            status="succeeded",
            req_per_s=rps,
            ttft_p99_ms=100.0,
            engine_settings={"max_num_seqs": seqs},
        )
    page = viewer_client.get("/benchmarks/?deployment=tiny").content.decode()
    assert 'data-testid="trend"' in page and "Requests/s per run" in page
    assert "Compare A and B" in page and page.count('type="radio"') == 4
    assert viewer_client.get("/benchmarks/").status_code == 200
    assert viewer_client.get("/benchmarks/?deployment=nope").status_code == 404


def test_compare_page_highlights_the_changed_setting(viewer_client, deployment):
    a, b = (
        BenchmarkRun.objects.create(
            deployment=deployment,
            prompt_tokens=16,
            output_tokens=4,
            concurrency=4,
            duration_s=5,
            status="succeeded",
            req_per_s=rps,
            engine_settings={"max_num_seqs": seqs, "dtype": "auto"},
            timeline={"t": [0, 1], "output_tokens": [5, 6], "ttft_p50_ms": [1.0, 2.0]},
        )
        for seqs, rps in ((4, 10.0), (16, 14.0))
    )
    page = viewer_client.get(f"/benchmarks/compare?a={a.pk}&b={b.pk}").content.decode()
    assert "1 changed" in page and "<strong>max_num_seqs</strong>" in page
    assert "+40.0%" in page and "better" in page and "bench-chart" in page
    assert viewer_client.get("/benchmarks/compare?a=1").status_code == 404


def test_cancel_from_the_page(operator_client, deployment):
    operator_client.post("/benchmarks/new", FORM)
    run = BenchmarkRun.objects.get()
    resp = operator_client.post(f"/benchmarks/{run.pk}/cancel")
    assert resp.status_code == 302
    run.refresh_from_db()
    assert run.status == "cancelled"


def test_the_snapshot_hides_secret_env_values(deployment):
    Deployment.objects.filter(pk=deployment.pk).update(
        extra_env={"HF_TOKEN": "hf_secret", "VLLM_USE_V1": "1"},
        extra_args=["--api-key", "sk-xyz"],
    )
    deployment.refresh_from_db()
    snap = services.engine_snapshot(deployment)
    assert "hf_secret" not in str(snap) and "sk-xyz" not in str(snap)
    assert snap["extra_env"]["VLLM_USE_V1"] == "1" and snap["max_num_seqs"] == 4
