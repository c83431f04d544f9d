"""A small parser for the Prometheus text format and a summary of vLLM's metrics.

No dependency: vLLM's /metrics is plain `name{label="v",...} value [timestamp]` lines, with
`# HELP` / `# TYPE` comments. Samples are summed across label sets (model_name, engine, ...),
so an engine with several data-parallel ranks reads as one.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import NamedTuple

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}

# summary key -> metric names, first present wins (older vLLM names after the current ones)
GAUGES_AND_COUNTERS = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total",),
    "generation_tokens_total": ("vllm:generation_tokens_total",),
    "num_preemptions_total": ("vllm:num_preemptions_total",),
}
HISTOGRAMS = {
    "time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    "inter_token_latency_seconds": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
}


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    found = {}
    for match in _LABEL.finditer(text[1:-1]):
        value = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m[0]], match[2])
        found[match[1]] = value
    return found


def parse(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition; malformed lines are skipped."""
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match[3])
        except ValueError:
            continue
        samples.append(Sample(match[1], _labels(match[2]), value))
    return samples


def _sums(samples: list[Sample]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for sample in samples:
        if not sample.name.endswith("_bucket"):
            totals[sample.name] += sample.value
    return totals


def _buckets(samples: list[Sample], name: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) pairs of histogram `name`, summed across label sets."""
    by_le: dict[float, float] = defaultdict(float)
    for sample in samples:
        if sample.name == name + "_bucket" and "le" in sample.labels:
            try:
                by_le[float(sample.labels["le"])] += sample.value
            except ValueError:
                continue
    return sorted(by_le.items())


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' estimate: linear interpolation inside the bucket holding rank q*count.
    None when there are no observations; the last finite bound when the rank is in +Inf."""
    if not buckets or not math.isinf(buckets[-1][0]) or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for upper_bound, count in buckets:
        if count >= rank:
            if math.isinf(upper_bound):
                return lower_bound
            if count == lower_count:
                return upper_bound
            fraction = (rank - lower_count) / (count - lower_count)
            return lower_bound + (upper_bound - lower_bound) * fraction
        lower_bound, lower_count = upper_bound, count
    return lower_bound


def vllm_summary(samples: list[Sample]) -> dict[str, float]:
    """The metrics the console shows, keyed without the `vllm:` prefix: gauges and counters
    (see GAUGES_AND_COUNTERS), and for each histogram `<key>_sum`, `_count`, `_p50`, `_p99`.
    A metric the engine does not expose is absent (never 0 by default)."""
    totals = _sums(samples)
    summary: dict[str, float] = {}
    for key, names in GAUGES_AND_COUNTERS.items():
        name = next((n for n in names if n in totals), None)
        if name is not None:
            summary[key] = totals[name]
    for key, names in HISTOGRAMS.items():
        name = next((n for n in names if n + "_count" in totals), None)
        if name is None:
            continue
        summary[key + "_sum"] = totals.get(name + "_sum", 0.0)
        summary[key + "_count"] = totals[name + "_count"]
        buckets = _buckets(samples, name)
        for q, suffix in ((0.5, "_p50"), (0.99, "_p99")):
            value = histogram_quantile(q, buckets)
            if value is not None:
                summary[key + suffix] = value
    return summary


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """vllm_summary(parse(text))."""
    return vllm_summary(parse(text))
