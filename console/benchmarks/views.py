"""Benchmark pages: runs of a deployment (start form, trend charts), one run (live progress,
results, per-second charts), two runs side by side."""

from __future__ import annotations

import json

from django.contrib import messages
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from console.accounts.decorators import role_required
from console.accounts.services import actor_from_request
from console.benchmarks import services
from console.benchmarks.models import METRICS, BenchmarkRun
from console.benchmarks.schemas import BenchmarkIn
from console.deployments.models import Deployment
from console.errors import DomainError, Invalid

FORM_FIELDS = ("prompt_tokens", "output_tokens", "duration_s", "max_requests", "seed")
TREND_RUNS = 50


def parse_form(post) -> dict:
    """Browser fields -> the API's BenchmarkIn; Invalid names the field exactly as the API."""
    data = {k: post.get(k, "").strip() for k in FORM_FIELDS if post.get(k, "").strip()}
    shape, amount = post.get("load", "concurrency"), post.get("load_value", "").strip()
    if shape not in ("concurrency", "request_rate"):
        raise Invalid("load is concurrency or request_rate", field="load")
    if amount:
        data[shape] = amount
    try:
        return BenchmarkIn.model_validate(data).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or "form"
        raise Invalid(f"{field}: {err.get('msg')}", field=field) from None


def _trend(runs: list[BenchmarkRun]) -> list[dict]:
    """Req/s and TTFT p99 of finished runs over time (oldest first), one chart each."""
    done = sorted(
        (r for r in runs if r.req_per_s is not None and r.status == "succeeded"),
        key=lambda r: r.created_at,
    )
    xs = [int(r.created_at.timestamp()) for r in done]
    specs = [
        ("Requests/s per run", "req/s", [("req/s", [r.req_per_s for r in done])]),
        (
            "Output tokens/s per run",
            "tok/s",
            [("tokens/s", [r.output_tokens_per_s for r in done])],
        ),
        (
            "TTFT per run (ms)",
            "ms",
            [("p50", [r.ttft_p50_ms for r in done]), ("p99", [r.ttft_p99_ms for r in done])],
        ),
    ]
    return [
        {
            "title": title,
            "json": json.dumps(
                {
                    "x": xs,
                    "yLabel": unit,
                    "series": [{"label": lbl, "values": vals} for lbl, vals in series],
                }
            ),
        }
        for title, unit, series in specs
    ]


@role_required("viewer")
def run_list(request):
    """All runs, or one deployment's (`?deployment=`) with its trend charts and start form."""
    name = request.GET.get("deployment", "").strip()
    dep = get_object_or_404(Deployment, name=name) if name else None
    runs = BenchmarkRun.objects.select_related("deployment", "created_by")
    if dep is not None:
        runs = runs.filter(deployment=dep)
    runs = list(runs[:200])
    context = {
        "dep": dep,
        "runs": runs,
        "deployments": Deployment.objects.order_by("name"),
        "trend": _trend(runs[:TREND_RUNS]) if dep is not None else [],
        "ready": services.ready_replicas(dep) if dep is not None else [],
        "post": {},
    }
    return render(request, "benchmarks/list.html", context)


@require_POST
@role_required("operator")
def run_new(request):
    name = request.POST.get("deployment", "")
    dep = get_object_or_404(Deployment, name=name)
    try:
        params = parse_form(request.POST)
        run = services.start_run(
            actor=actor_from_request(request), deployment=dep.name, params=params
        )
    except DomainError as exc:
        runs = list(dep.benchmark_runs.select_related("created_by")[:200])
        context = {
            "dep": dep,
            "runs": runs,
            "trend": _trend(runs[:TREND_RUNS]),
            "ready": services.ready_replicas(dep),
            "error": exc,
            "post": request.POST,
        }
        return render(request, "benchmarks/list.html", context, status=exc.status)
    messages.success(request, f"benchmark #{run.pk} of {dep.name} queued")
    return redirect("benchmark-detail", run_id=run.pk)


def _timeline_charts(run: BenchmarkRun) -> list[dict]:
    tl = run.timeline or {}
    if not tl.get("t"):
        return []
    specs = [
        ("Output tokens per second", "tok/s", [("tokens/s", "output_tokens")]),
        ("Requests finished per second", "req/s", [("done", "requests"), ("errors", "errors")]),
        ("TTFT p50 of each second (ms)", "ms", [("TTFT p50", "ttft_p50_ms")]),
        ("Requests in flight", "", [("in flight", "in_flight")]),
    ]
    return [
        {
            "title": title,
            "json": json.dumps(
                {
                    "x": tl["t"],
                    "xMax": max(run.duration_s, tl["t"][-1]),
                    "yLabel": unit,
                    "series": [{"label": lbl, "values": tl.get(key, [])} for lbl, key in cols],
                }
            ),
        }
        for title, unit, cols in specs
    ]


@role_required("viewer")
def run_detail(request, run_id: int):
    """The run; htmx polls (#live) refresh progress every second until it ends."""
    run = get_object_or_404(
        BenchmarkRun.objects.select_related("deployment", "created_by"), pk=run_id
    )
    context = {"run": run, "charts": _timeline_charts(run), "metrics": _metrics(run)}
    context["settings_rows"] = [
        (k, v) for k, v in (run.engine_settings or {}).items() if v not in (None, "", [], {})
    ]
    template = "benchmarks/run.html#live" if request.htmx else "benchmarks/run.html"
    return render(request, template, context)


def _metrics(run: BenchmarkRun) -> list[dict]:
    return [
        {"key": key, "label": label, "unit": unit, "value": getattr(run, key)}
        for key, label, unit, _ in METRICS
    ]


@require_POST
@role_required("operator")
def run_cancel(request, run_id: int):
    try:
        services.cancel_run(actor=actor_from_request(request), run_id=run_id)
        messages.success(request, f"benchmark #{run_id} cancelled")
    except DomainError as exc:
        if exc.status == 404:
            raise Http404(exc.message) from exc
        messages.error(request, exc.message)
    return redirect("benchmark-detail", run_id=run_id)


@role_required("viewer")
def run_compare(request):
    """Two runs side by side: metrics with deltas, params and engine settings that differ."""
    try:
        a, b = int(request.GET.get("a", "")), int(request.GET.get("b", ""))
    except ValueError:
        raise Http404("compare needs two run ids, ?a=&b=") from None
    run_a, run_b = (
        get_object_or_404(BenchmarkRun.objects.select_related("deployment"), pk=pk) for pk in (a, b)
    )
    context = {"a": run_a, "b": run_b, **services.compare_runs(run_a, run_b)}
    context["overlay"] = _overlay(run_a, run_b)
    sa, sb = run_a.engine_settings or {}, run_b.engine_settings or {}
    context["settings_rows"] = [
        {"key": k, "a": sa.get(k), "b": sb.get(k), "changed": sa.get(k) != sb.get(k)}
        for k in sorted(set(sa) | set(sb), key=lambda k: (sa.get(k) == sb.get(k), k))
    ]
    return render(request, "benchmarks/compare.html", context)


def _overlay(a: BenchmarkRun, b: BenchmarkRun) -> list[dict]:
    """Both runs' per-second columns on one x axis (seconds since each run's start)."""
    ta, tb = a.timeline or {}, b.timeline or {}
    n = max(len(ta.get("t", [])), len(tb.get("t", [])))
    if not n:
        return []

    def col(tl: dict, key: str) -> list:
        values = list(tl.get(key, []))
        return values + [None] * (n - len(values))

    out = []
    for title, unit, key in (
        ("Output tokens per second", "tok/s", "output_tokens"),
        ("TTFT p50 of each second (ms)", "ms", "ttft_p50_ms"),
    ):
        series = [
            {"label": f"#{a.pk}", "values": col(ta, key)},
            {"label": f"#{b.pk}", "values": col(tb, key)},
        ]
        spec = {"x": list(range(n)), "yLabel": unit, "series": series}
        out.append({"title": title, "json": json.dumps(spec)})
    return out
