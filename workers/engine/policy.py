"""Decisions without I/O: when to restart, when to give up, when a ready engine is unhealthy."""

from __future__ import annotations

HEALTH_FAILURES = 3  # /health failures in a row before ready -> unhealthy
HANG_AFTER_S = 120.0  # requests waiting and no token generated for this long -> unhealthy


def backoff_delay(crashes: int, base_s: float, max_s: float) -> float:
    """Seconds to wait before restart after the n-th crash: base x 2^(n-1), capped at max_s."""
    return min(max_s, base_s * 2 ** max(0, crashes - 1))


def recent(crash_times: list[float], now: float, window_s: float) -> list[float]:
    """The crash times (wall clock) inside the window ending now."""
    return [t for t in crash_times if now - t <= window_s]


def gives_up(recent_crashes: int, restart_max: int) -> bool:
    """True when `restart_max` crashes happened within the window (restart_max 0: never
    restart)."""
    return recent_crashes >= restart_max


class HealthTracker:
    """Judges a ready engine from one probe + metrics scrape per interval.

    Unhealthy when /health failed `failures_allowed` times in a row, or when requests are
    waiting and generation_tokens_total has not grown for `hang_after_s` (the stall clock
    starts when requests start waiting, so an idle engine is never called hung).
    """

    def __init__(
        self, failures_allowed: int = HEALTH_FAILURES, hang_after_s: float = HANG_AFTER_S
    ) -> None:
        self.failures_allowed = failures_allowed
        self.hang_after_s = hang_after_s
        self.failures = 0
        self.tokens: float | None = None
        self.stall_since: float | None = None

    def observe(self, ok: bool, detail: str, metrics: dict[str, float], now: float) -> str | None:
        """Record one interval; returns why the engine is unhealthy, or None when it is not."""
        self.failures = 0 if ok else self.failures + 1
        if self.failures >= self.failures_allowed:
            return f"{detail} ({self.failures} failures in a row)"
        return self._hang(metrics, now)

    def _hang(self, metrics: dict[str, float], now: float) -> str | None:
        waiting = metrics.get("num_requests_waiting")
        tokens = metrics.get("generation_tokens_total")
        if waiting is None or tokens is None:
            return None  # no scrape this time: neither progress nor stall is known
        if tokens != self.tokens:
            self.tokens, self.stall_since = tokens, None
        if waiting <= 0:
            self.stall_since = None
            return None
        if self.stall_since is None:
            self.stall_since = now
        stalled = now - self.stall_since
        if stalled >= self.hang_after_s:
            return (
                f"hung: {waiting:g} request(s) waiting and no token generated "
                f"for {stalled:.0f}s (generation_tokens_total stuck at {tokens:g})"
            )
        return None
