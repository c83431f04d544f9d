"""Summary statistics of a load test: percentiles, throughput, per-second timeline.

Definitions follow vLLM's `vllm bench serve` so numbers can be read side by side with it:
TTFT is the time from sending a request to its first streamed chunk with choices; ITL the gaps
between successive such chunks of one request; E2E the whole request; throughput divides by the
time from the first request sent to the last one finished.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's
    default), or None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within 0..100, not {q}")
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def ms(value: float | None) -> float | None:
    """Seconds -> milliseconds rounded to 0.01 ms (None stays None)."""
    return None if value is None else round(value * 1000, 2)


def summarize(
    *,
    ttfts: Sequence[float],
    itls: Sequence[float],
    e2es: Sequence[float],
    output_tokens: int,
    prompt_tokens: Sequence[int],
    duration_s: float,
) -> dict:
    """Results of successful requests (all latencies in seconds in, milliseconds out)."""
    done = len(e2es)
    rate = (lambda n: round(n / duration_s, 3)) if duration_s > 0 else (lambda n: None)
    return {
        "requests": done,
        "duration_measured_s": round(duration_s, 3),
        "req_per_s": rate(done) if done else 0.0,
        "output_tokens_total": output_tokens,
        "output_tokens_per_s": rate(output_tokens) if done else 0.0,
        "prompt_tokens_mean": round(sum(prompt_tokens) / len(prompt_tokens), 1)
        if prompt_tokens
        else None,
        "ttft_p50_ms": ms(percentile(ttfts, 50)),
        "ttft_p99_ms": ms(percentile(ttfts, 99)),
        "itl_p50_ms": ms(percentile(itls, 50)),
        "itl_p99_ms": ms(percentile(itls, 99)),
        "e2e_p50_ms": ms(percentile(e2es, 50)),
        "e2e_p99_ms": ms(percentile(e2es, 99)),
    }
