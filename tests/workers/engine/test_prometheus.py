"""Prometheus text parsing and the vLLM summary (histogram percentiles from buckets).

The fixture is synthetic — written from vLLM's metric names; no real /metrics capture is in
shared/ yet (to be replaced by one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.engine.prometheus import histogram_quantile, parse, parse_vllm_metrics

SYNTHETIC = Path(__file__).parent / "fixtures" / "vllm-metrics-synthetic.txt"


def test_summary_sums_label_sets_and_derives_percentiles():
    summary = parse_vllm_metrics(SYNTHETIC.read_text())
    assert summary["num_requests_running"] == 4
    assert summary["num_requests_waiting"] == 2
    assert summary["kv_cache_usage_perc"] == pytest.approx(0.375)
    assert summary["prompt_tokens_total"] == 2000
    assert summary["generation_tokens_total"] == 5120
    assert summary["num_preemptions_total"] == 1
    assert summary["time_to_first_token_seconds_count"] == 20
    assert summary["time_to_first_token_seconds_sum"] == pytest.approx(2.392)
    assert summary["time_to_first_token_seconds_p50"] == pytest.approx(0.08)
    assert summary["time_to_first_token_seconds_p99"] == pytest.approx(0.247)
    assert summary["inter_token_latency_seconds_count"] == 200
    assert summary["inter_token_latency_seconds_p50"] == pytest.approx(0.02)
    assert summary["inter_token_latency_seconds_p99"] == pytest.approx(0.095)


def test_older_metric_names_are_accepted():
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 3\n'
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.9\n'
    )
    summary = parse_vllm_metrics(text)
    assert summary["kv_cache_usage_perc"] == 0.5
    assert summary["inter_token_latency_seconds_count"] == 4
    assert summary["inter_token_latency_seconds_p50"] == pytest.approx(0.1 * 2 / 3)
    assert summary["inter_token_latency_seconds_p99"] == 0.1  # in +Inf: the last finite bound


def test_absent_metrics_stay_absent_and_empty_histograms_have_no_percentiles():
    text = 'vllm:time_to_first_token_seconds_bucket{le="+Inf"} 0\nvllm:time_to_first_token_seconds_count 0\n'
    summary = parse_vllm_metrics(text)
    assert "num_requests_waiting" not in summary
    assert summary["time_to_first_token_seconds_count"] == 0
    assert "time_to_first_token_seconds_p50" not in summary


def test_parser_handles_escapes_timestamps_and_junk():
    samples = parse(
        'm{a="x\\"y",b="1,2}"} 1.5 1700000000000\n'
        "bare 2\n"
        "not a sample line\n"
        "m_inf +Inf\n"
        "m_bad NaNx\n"
    )
    assert samples[0].labels == {"a": 'x"y', "b": "1,2}"} and samples[0].value == 1.5
    assert [s.name for s in samples] == ["m", "bare", "m_inf"]


def test_quantile_interpolates_inside_a_bucket():
    buckets = [(1.0, 0.0), (2.0, 10.0), (float("inf"), 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.5)
    assert histogram_quantile(0.5, []) is None
