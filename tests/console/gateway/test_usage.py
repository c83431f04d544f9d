"""Usage counters: folded from Redis into rows, nothing lost when a flush dies half-way."""

from __future__ import annotations

import pytest

from console.accounts.services import Actor, create_token
from console.gateway import usage
from console.gateway.models import Usage
from console.hot import get_redis
from tests.helpers import make_user

pytestmark = pytest.mark.django_db


def add(token_id: int, model: str, **kw) -> None:
    for field, n in usage.fields_for(token_id, model, **kw).items():
        get_redis().hincrby(usage.KEY, field, n)


@pytest.fixture(autouse=True)
def clean_redis():
    r = get_redis()
    for key in r.scan_iter("npc:gw:*"):
        r.delete(key)


def test_counters_fold_into_one_row_per_token_model_and_day():
    user = make_user("ann", "viewer")
    token, _ = create_token(actor=Actor(user=user, name="ann"), name="svc")
    add(token.pk, "m", ok=True, prompt=3, completion=7)
    add(token.pk, "m", ok=False, prompt=2, completion=0)
    add(token.pk, "other", ok=True, prompt=1, completion=1)
    assert usage.flush() == 2
    add(token.pk, "m", ok=True, prompt=10, completion=10)
    usage.flush()
    row = Usage.objects.get(token=token, model="m")
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (3, 1, 15, 17)
    assert row.user == user and row.token_name == "svc"
    assert usage.flush() == 0  # nothing new: nothing touched


def test_a_flush_that_died_after_the_rename_is_finished_by_the_next():
    user = make_user("bo", "viewer")
    token, _ = create_token(actor=Actor(user=user, name="bo"), name="svc")
    add(token.pk, "m", ok=True, prompt=4, completion=4)
    r = get_redis()
    r.rename(usage.KEY, usage.FLUSHING + "dead-worker")  # renamed, then the worker died
    add(token.pk, "m", ok=True, prompt=1, completion=1)  # requests kept counting meanwhile
    usage.flush()
    row = Usage.objects.get(token=token, model="m")
    assert (row.requests, row.prompt_tokens) == (2, 5)
    assert not list(r.scan_iter(usage.FLUSHING + "*"))


def test_usage_of_a_deleted_token_is_kept():
    user = make_user("cy", "viewer")
    token, _ = create_token(actor=Actor(user=user, name="cy"), name="gone")
    add(token.pk, "m", ok=True, prompt=1, completion=1)
    token_id = token.pk
    token.delete()
    usage.flush()
    row = Usage.objects.get(model="m")
    assert row.token is None and row.token_name == f"deleted token {token_id}"
