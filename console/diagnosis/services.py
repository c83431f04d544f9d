"""Diagnosis services: input checks shared by the API, the page and the `diagnose` command.

No side effects: nothing is stored (incidents come later). Errors are console.errors.Invalid,
which the API maps to 422 {"message", "field"} and the page shows next to the field.
"""

from __future__ import annotations

from console.diagnosis.matcher import Diagnosis, diagnose
from console.diagnosis.rulebook import HEALTH_VALUES
from console.errors import Invalid

MAX_TEXT_BYTES = 5 * 1024 * 1024  # 5 MB of log text (UTF-8)
_HEALTH = {v.lower(): v for v in HEALTH_VALUES}


def check_text(text: str) -> str:
    """The text itself, or Invalid(field="text") when it is over 5 MB."""
    # A character is 1-4 bytes in UTF-8: only encode when the length alone cannot decide.
    too_big = len(text) > MAX_TEXT_BYTES or (
        len(text) * 4 > MAX_TEXT_BYTES
        and len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES
    )
    if too_big:
        raise Invalid(
            "text: the log is larger than 5 MB; paste the part around the first error",
            field="text",
        )
    return text


def check_health(health: str | None) -> str | None:
    if health is None or not str(health).strip():
        return None
    value = _HEALTH.get(str(health).strip().lower())
    if value is None:
        raise Invalid(f"health: expected one of {', '.join(HEALTH_VALUES)}", field="health")
    return value


def diagnose_text(
    *,
    text: str,
    exit_code: int | None = None,
    signal: int | None = None,
    health: str | None = None,
    telemetry: dict[str, float] | None = None,
) -> list[Diagnosis]:
    """Check the inputs, then run the matcher (ranked, possibly empty)."""
    return diagnose(
        check_text(text),
        exit_code=exit_code,
        signal=signal,
        health=check_health(health),
        telemetry=telemetry,
    )
