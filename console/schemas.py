"""The base of every API input shape: an unknown field is refused (422 naming it), never dropped.

A misspelt `tensor_paralel_size: 4` used to create a TP 1 deployment (201) and `expires_in_days`
on a token made one that never expires: the API now answers 422 with the field, and the
nearest known field when one is close (console/api.py on_validation).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from ninja import Schema
from pydantic import AfterValidator, AwareDatetime, ConfigDict


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid")


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("date out of range once converted to UTC") from None


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A time given by a client: it must carry an offset (a bare `2030-01-01T00:00` is a 422, not a
guess), and it is kept in UTC. PostgreSQL refuses offsets past 15:59 (`+20:51` was a 500 from
`GET /api/v1/audit?since=`), and an aware time compared with a naive one was a TypeError."""
