"""Diagnosis services: input checks shared by the API, the page and the `diagnose` command.

No side effects: nothing is stored (incidents come later). Errors are console.errors.Invalid,
which the API maps to 422 {"message", "field"} and the page shows next to the field.
"""

from __future__ import annotations

import codecs
import re
import time

from console.diagnosis.matcher import Diagnosis, DiagnosisTimeout, diagnose
from console.diagnosis.rulebook import HEALTH_VALUES
from console.errors import Invalid

MAX_TEXT_BYTES = 5 * 1024 * 1024  # 5 MB of log text (UTF-8)
MAX_FILE_BYTES = 256 * 1024 * 1024  # a file named to the `diagnose` command (read whole)
MAX_UPLOAD_BYTES = 32 * 1024 * 1024  # a file uploaded on the page: deploy/nginx's body limit
HEAD_BYTES = 1024 * 1024  # of a file over MAX_TEXT_BYTES: its first MB and last 4 MB are read
TIME_LIMIT_S = 10.0  # a pasted log's pass (5 MB of hostile text takes < 1 s: docs/diagnosis.md)
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


_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_BOMS = (  # longest first: UTF-32 LE's mark begins with UTF-16 LE's
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode_log(data: bytes) -> str:
    """A log file's bytes as text, in the encoding it was saved in.

    A byte-order mark decides (Windows PowerShell's `>` writes UTF-16 LE with one); UTF-16
    without one shows as a NUL beside every ASCII character. Then UTF-8, kept when most of its
    multi-byte characters read (a log cut mid-character, a stray binary byte); else GB18030, what
    a Chinese-locale terminal or Windows saves (its GBK subset), so those words stay readable;
    else UTF-8 with U+FFFD for the bytes it cannot read."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    head = data[:4096]
    if len(head) >= 2 and head.count(0) * 3 > len(head):
        odd_nuls = head[1::2].count(0) > head[0::2].count(0)
        return data.decode("utf-16-le" if odd_nuls else "utf-16-be", errors="replace")
    text = data.decode("utf-8", errors="replace")
    unread = text.count("\ufffd")
    if not unread or unread * 4 < len(_NON_ASCII.findall(text)):
        return text
    try:
        return data.decode("gb18030")
    except UnicodeDecodeError:
        return text


def excerpt(text: str) -> tuple[str, str | None]:
    """A whole log file, as the command and the page's upload take it: over MAX_TEXT_BYTES,
    its first MB (versions, settings, the first warnings) and its last 4 MB (the failure), cut
    at line ends, with a line in place of what was left out. Returns the text and a note
    saying what was left out (None when the whole log was kept)."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_TEXT_BYTES:
        return text, None
    tail_budget = MAX_TEXT_BYTES - HEAD_BYTES - 200  # the marker line fits in what is left
    head_end = data.rfind(b"\n", 0, HEAD_BYTES) + 1 or HEAD_BYTES
    tail_start = data.find(b"\n", len(data) - tail_budget) + 1 or len(data) - tail_budget
    lines_out = data.count(b"\n", head_end, tail_start)
    note = (
        f"The log is {len(data) / 2**20:.1f} MB: read its first {head_end / 2**20:.1f} MB and "
        f"its last {(len(data) - tail_start) / 2**20:.1f} MB; {lines_out:,} lines between them "
        f"were left out (lines after the gap are numbered {max(lines_out - 1, 0):,} lower "
        "than in the file)."
    )
    marker = f"[… {lines_out:,} lines left out: a diagnosis reads 5 MB …]\n"
    head = data[:head_end].decode("utf-8", errors="replace")
    return head + marker + data[tail_start:].decode("utf-8", errors="replace"), note


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
    time_limit_s: float | None = TIME_LIMIT_S,
) -> list[Diagnosis]:
    """Check the inputs, then run the matcher (ranked, possibly empty) within `time_limit_s`
    (Invalid on the `text` field when it is passed)."""
    text = check_text(text)
    health = check_health(health)
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    try:
        return diagnose(
            text,
            exit_code=exit_code,
            signal=signal,
            health=health,
            telemetry=telemetry,
            deadline=deadline,
        )
    except DiagnosisTimeout:
        raise Invalid(
            f"text: the log took longer than {time_limit_s:g} s to diagnose; paste the part "
            "around the first error",
            field="text",
        ) from None
