from __future__ import annotations

from datetime import datetime

from ninja import Schema


class LogLineOut(Schema):
    cursor: str
    line_no: int
    text: str
    level: str
    at: datetime
    gap_before: bool


class LogPageOut(Schema):
    lines: list[LogLineOut]
    next_cursor: str
    run: str | None
    runs: list[str]
