"""Restart and health decisions (no processes)."""

from __future__ import annotations

from workers.engine.policy import HealthTracker, backoff_delay, gives_up, recent


def test_backoff_doubles_and_is_capped():
    assert [backoff_delay(n, 2.0, 10.0) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 10.0]


def test_crash_window_and_give_up():
    assert recent([100.0, 500.0, 650.0], now=701.0, window_s=600) == [500.0, 650.0]
    assert not gives_up(2, restart_max=3) and gives_up(3, restart_max=3)
    assert gives_up(1, restart_max=0)  # restart_max 0: never restart


def test_three_health_failures_in_a_row_make_it_unhealthy():
    tracker = HealthTracker(failures_allowed=3)
    verdicts = [tracker.observe(ok, "/health: HTTP 503", {}, 0) for ok in (False, False, True)]
    assert verdicts == [None, None, None]  # the success reset the count
    verdicts = [tracker.observe(False, "/health: HTTP 503", {}, 0) for _ in range(3)]
    assert verdicts[-1] == "/health: HTTP 503 (3 failures in a row)"


def test_hang_needs_waiting_requests_and_no_token_progress():
    tracker = HealthTracker(hang_after_s=120)
    idle = {"num_requests_waiting": 0, "generation_tokens_total": 10}
    assert tracker.observe(True, "", idle, 0) is None
    assert tracker.observe(True, "", idle, 1000) is None  # idle for long: not hung
    stuck = {"num_requests_waiting": 4, "generation_tokens_total": 10}
    assert tracker.observe(True, "", stuck, 1001) is None  # the stall clock starts now
    assert tracker.observe(True, "", stuck, 1100) is None
    reason = tracker.observe(True, "", stuck, 1121)
    assert reason and "4 request(s) waiting and no token generated for 120s" in reason
    moving = {"num_requests_waiting": 4, "generation_tokens_total": 11}
    assert tracker.observe(True, "", moving, 1122) is None  # progress clears it
