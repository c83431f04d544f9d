"""Usage counting: one Redis pipeline on the request path, folded into the database later.

A request adds to fields of one hash (`npc:gw:usage`), named `day|token id|model|counter`.
`flush()` renames the hash (atomic, so requests keep counting into a fresh one), adds its
counters to the `Usage` rows in one transaction and only then deletes the renamed copy;
copies left by a flush that died half-way are picked up by the next one, so nothing counted
is lost on a crash (at worst a crash after the commit and before the delete counts twice;
the delete follows the commit directly).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import date

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from console.accounts.models import ApiToken
from console.hot import get_redis

from .models import Usage

KEY = "npc:gw:usage"
FLUSHING = "npc:gw:usage:flushing:"
COUNTERS = ("requests", "errors", "prompt_tokens", "completion_tokens", "limited")


def fields_for(
    token_id: int, model: str, *, ok: bool, prompt: int, completion: int, limited: bool = False
) -> dict:
    day = timezone.localdate().isoformat()
    base = f"{day}|{token_id}|{model}|"
    out = {base + "requests": 1}
    if limited:
        out[base + "limited"] = 1
    elif not ok:
        out[base + "errors"] = 1
    if prompt:
        out[base + "prompt_tokens"] = prompt
    if completion:
        out[base + "completion_tokens"] = completion
    return out


def flush() -> int:
    """Fold the counted usage into `Usage` rows. Returns how many rows it touched."""
    redis = get_redis()
    pending = [k.decode() for k in redis.scan_iter(match=FLUSHING + "*", count=100)]
    mine = FLUSHING + uuid.uuid4().hex
    try:
        redis.rename(KEY, mine)
        pending.append(mine)
    except Exception as exc:  # redis.ResponseError: no such key (nothing counted)
        if "no such key" not in str(exc).lower():
            raise
    touched = 0
    for key in pending:
        raw = redis.hgetall(key)
        touched += _apply(raw)
        redis.delete(key)
    return touched


def _apply(raw: dict[bytes, bytes]) -> int:
    sums: dict[tuple[str, int, str], dict[str, int]] = defaultdict(dict)
    for field, value in raw.items():
        try:
            day, token_id, model, counter = field.decode().split("|", 3)
            sums[(day, int(token_id), model)][counter] = int(value)
        except ValueError:
            continue  # not ours
    if not sums:
        return 0
    tokens = {
        t.pk: t for t in ApiToken.objects.filter(pk__in={k[1] for k in sums}).select_related("user")
    }
    with transaction.atomic():
        for (day, token_id, model), counts in sums.items():
            token = tokens.get(token_id)
            row, _ = Usage.objects.get_or_create(
                day=date.fromisoformat(day),
                token=token,
                model=model,
                defaults={
                    "token_name": token.name if token else f"deleted token {token_id}",
                    "user": token.user if token else None,
                },
            )
            Usage.objects.filter(pk=row.pk).update(
                **{c: F(c) + counts[c] for c in COUNTERS if counts.get(c)}
            )
    return len(sums)
