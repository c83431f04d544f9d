"""Percentiles and summaries, checked against hand-computed values (numpy's linear rule)."""

from __future__ import annotations

import pytest

from console.benchmarks.stats import percentile, summarize


def test_percentile_interpolates_between_closest_ranks():
    assert percentile([4, 1, 3, 2], 50) == 2.5  # unsorted input
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([1, 2, 3, 4, 5], 0) == 1 and percentile([1, 2, 3, 4, 5], 100) == 5
    assert percentile([7.5], 99) == 7.5


def test_percentile_of_nothing_is_none_and_bad_q_is_refused():
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_summary_reports_milliseconds_and_rates_over_the_measured_time():
    out = summarize(
        ttfts=[0.1, 0.2, 0.3],
        itls=[0.01, 0.02, 0.03, 0.04],
        e2es=[1.0, 2.0, 3.0],
        output_tokens=300,
        prompt_tokens=[10, 20, 30],
        duration_s=4.0,
    )
    assert out["requests"] == 3 and out["req_per_s"] == 0.75
    assert out["output_tokens_per_s"] == 75.0 and out["prompt_tokens_mean"] == 20.0
    assert out["ttft_p50_ms"] == 200.0 and out["ttft_p99_ms"] == pytest.approx(298.0)
    assert out["itl_p50_ms"] == 25.0 and out["e2e_p99_ms"] == pytest.approx(2980.0)


def test_summary_without_successes_has_no_latencies():
    out = summarize(ttfts=[], itls=[], e2es=[], output_tokens=0, prompt_tokens=[], duration_s=0.0)
    assert out["requests"] == 0 and out["req_per_s"] == 0.0 and out["ttft_p50_ms"] is None
