"""The base of every API input shape: an unknown field is refused (422 naming it), never dropped.

A misspelt `tensor_paralel_size: 4` used to create a TP 1 deployment (201) and `expires_in_days`
on a token made one that never expires: the API now answers 422 with the field, and the
nearest known field when one is close (console/api.py on_validation).
"""

from __future__ import annotations

from ninja import Schema
from pydantic import ConfigDict


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid")
