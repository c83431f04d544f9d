"""One way to wait in a test: poll a check against a deadline, never sleep blindly."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    message: str = "condition",
    *,
    interval: float = 0.05,
) -> T:
    """Call `predicate` every `interval` s until it returns something truthy; return that.

    Past `timeout` s: AssertionError "timed out after <timeout>s waiting for <message>", with
    the last value the check returned. An exception raised by `predicate` ends the wait at
    once (a check can fail fast, e.g. when the process it waits on has exited). The check
    always runs at least once, and once more after the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {message} (last returned {value!r})"
            )
        time.sleep(interval)
