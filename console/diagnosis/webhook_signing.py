"""Webhook signatures with a timestamp (Stripe/Slack style): standard library only.

A delivery carries

    X-NPU-Console-Timestamp: 1717171717
    X-NPU-Console-Signature: t=1717171717,v1=<hex HMAC-SHA256(secret, "1717171717." + body)>

A receiver recomputes the HMAC over `"{t}.{raw body}"` with the endpoint's secret, compares
it in constant time and refuses a timestamp more than TOLERANCE_S away from its own clock, so a
captured delivery cannot be replayed later. `verify` is that check, pure (the clock is an
argument): copy this file into a receiver as it is (docs/diagnosis.md "Webhooks").
"""

from __future__ import annotations

import hashlib
import hmac

TIMESTAMP_HEADER = "X-NPU-Console-Timestamp"
SIGNATURE_HEADER = "X-NPU-Console-Signature"
TOLERANCE_S = 300


def signature(body: bytes, secret: str, timestamp: int) -> str:
    """Hex HMAC-SHA256 of `"{timestamp}." + body` under `secret`."""
    signed = f"{int(timestamp)}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def signature_header(body: bytes, secret: str, timestamp: int) -> str:
    """The X-NPU-Console-Signature value: `t=<timestamp>,v1=<signature>`."""
    return f"t={int(timestamp)},v1={signature(body, secret, timestamp)}"


def parse_header(header: str) -> tuple[int | None, list[str]]:
    """(t, [v1 signatures]) of a signature header; t is None when absent or malformed.
    Several v1 values are allowed (a sender rotating its secret signs with both)."""
    timestamp, signatures = None, []
    for item in (header or "").split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and value.isdigit():
            timestamp = int(value)
        elif key == "v1" and value:
            signatures.append(value)
    return timestamp, signatures


def verify(
    body: bytes, header: str, secret: str, *, now: float, tolerance_s: int = TOLERANCE_S
) -> bool:
    """True when `header` signs exactly `body` under `secret` with a timestamp within
    `tolerance_s` seconds of `now` (Unix seconds). Pure: no clock, no I/O."""
    timestamp, signatures = parse_header(header)
    if timestamp is None or not signatures or not secret:
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = signature(body, secret, timestamp)
    return any(hmac.compare_digest(expected, given) for given in signatures)
