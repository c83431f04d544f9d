"""The built-in load client against a local fake OpenAI streaming server: real sockets, real
timing. Bounds are loose enough for a busy 2-core machine, tight enough to catch a wrong clock."""

from __future__ import annotations

import time

import pytest

from console.benchmarks.runner import LoadParams, LoadRun
from tests.kit import FakeEngine, closed_port


def run_to_end(params: LoadParams, urls: list[str], timeout: float = 30) -> LoadRun:
    run = LoadRun(params, urls).start()
    assert run.join(timeout), "the load run did not end"
    assert run.error is None, run.error
    return run


def test_closed_loop_measures_ttft_itl_and_e2e_from_the_stream():
    with FakeEngine(ttft_s=0.15, itl_s=0.03) as engine:
        params = LoadParams(
            model="m", prompt_tokens=40, output_tokens=8, duration_s=2, concurrency=3
        )
        run = run_to_end(params, [engine.url])
    r = run.recorder.results()
    assert engine.max_in_flight == 3  # exactly `concurrency` users, never more
    assert r["requests"] >= 6 and r["errors"] == 0 and r["unfinished"] == 0
    assert 150 <= r["ttft_p50_ms"] < 450
    assert 30 <= r["itl_p50_ms"] < 150
    assert r["e2e_p50_ms"] >= 150 + 7 * 30  # first chunk + 7 gaps
    assert r["output_tokens_total"] == 8 * r["requests"]
    assert r["req_per_s"] == pytest.approx(r["requests"] / r["duration_measured_s"], rel=0.01)
    assert r["prompt_tokens_mean"] == 40  # /tokenize said 2 tokens a word: 20 words asked
    body = engine.requests[0]
    assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 8
    assert body["stream_options"] == {"include_usage": True} and body["model"] == "m"


def test_timeline_has_one_row_per_second():
    with FakeEngine(ttft_s=0.02, itl_s=0.005) as engine:
        params = LoadParams(
            model="m", prompt_tokens=4, output_tokens=4, duration_s=2.5, concurrency=2
        )
        run = run_to_end(params, [engine.url])
    tl = run.recorder.timeline()
    assert tl["t"] == list(range(len(tl["t"]))) and 2 <= len(tl["t"]) <= 4
    assert sum(tl["requests"]) == run.recorder.results()["requests"]
    assert all(v > 0 for v in tl["output_tokens"][:2]) and max(tl["in_flight"]) == 2


def test_chunks_carrying_several_tokens_still_add_up():
    with FakeEngine(ttft_s=0.02, itl_s=0.02, tokens_per_chunk=3) as engine:
        params = LoadParams(
            model="m", prompt_tokens=4, output_tokens=9, duration_s=1, concurrency=1
        )
        run = run_to_end(params, [engine.url])
    r = run.recorder.results()
    assert r["output_tokens_total"] == 9 * r["requests"]  # from usage, not the chunk count
    assert sum(run.recorder.timeline()["output_tokens"]) == r["output_tokens_total"]
    assert len(run.recorder.itls) == 2 * r["requests"]  # gaps between the 3 chunks, as vllm bench


def test_open_loop_sends_at_the_asked_rate_whatever_the_answers():
    with FakeEngine(ttft_s=0.3, itl_s=0.01) as engine:  # slow answers: arrivals must not wait
        params = LoadParams(
            model="m", prompt_tokens=4, output_tokens=2, duration_s=2, request_rate=20, seed=7
        )
        run = run_to_end(params, [engine.url])
    assert 20 <= len(engine.requests) <= 65  # Poisson around 40
    assert engine.max_in_flight >= 3  # a closed loop of 1 would never overlap
    assert run.recorder.results()["requests"] == len(engine.requests)


def test_errors_are_counted_with_a_sample_and_do_not_stop_the_run():
    with FakeEngine(ttft_s=0.01, itl_s=0.001, fail_every=3) as engine:
        params = LoadParams(
            model="m", prompt_tokens=4, output_tokens=2, duration_s=1, concurrency=2
        )
        run = run_to_end(params, [engine.url])
    r = run.recorder.results()
    assert r["errors"] == len(engine.requests) // 3 and r["requests"] > r["errors"] > 0
    assert any("HTTP 500" in e for e in r["error_samples"])


def test_max_requests_ends_the_run_early_and_targets_take_turns():
    with FakeEngine(ttft_s=0.01) as one, FakeEngine(ttft_s=0.01) as two:
        params = LoadParams(
            model="m",
            prompt_tokens=4,
            output_tokens=2,
            duration_s=60,
            concurrency=2,
            max_requests=6,
        )
        started = time.monotonic()
        run = run_to_end(params, [one.url, two.url])
    assert time.monotonic() - started < 20
    assert run.recorder.results()["requests"] == 6 and len(one.requests) == len(two.requests) == 3


def test_stop_cuts_off_requests_in_flight_at_once():
    with FakeEngine(ttft_s=0.05, itl_s=0.5) as engine:  # 10 tokens: 4.5 s per request
        params = LoadParams(
            model="m", prompt_tokens=4, output_tokens=10, duration_s=60, concurrency=2
        )
        run = LoadRun(params, [engine.url]).start()
        deadline = time.monotonic() + 10
        while run.snapshot().in_flight < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        run.stop()
        assert run.join(5), "stop did not end the run"
    r = run.recorder.results()
    assert r["unfinished"] == 2 and r["requests"] == 0 and r["errors"] == 0


def test_an_unreachable_target_is_errors_not_a_crash():
    params = LoadParams(model="m", prompt_tokens=4, output_tokens=2, duration_s=1, concurrency=1)
    run = run_to_end(params, [f"http://127.0.0.1:{closed_port()}"])  # connection refused
    r = run.recorder.results()
    assert r["requests"] == 0 and r["errors"] > 0 and "ConnectError" in r["error_samples"][0]


def test_exactly_one_load_shape():
    with pytest.raises(ValueError):
        LoadParams(model="m", prompt_tokens=1, output_tokens=1, duration_s=1)
    with pytest.raises(ValueError):
        LoadParams(
            model="m",
            prompt_tokens=1,
            output_tokens=1,
            duration_s=1,
            concurrency=1,
            request_rate=1.0,
        )
