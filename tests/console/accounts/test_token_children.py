"""Promise: a token creates only tokens within its own scope, models and lifetime (a parent's
limits clamp what is left unsaid, anything wider is a 403 naming the field), and revoking a
token revokes every token descending from it, each revocation audited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.accounts import services
from console.accounts.models import ApiToken, AuditEntry
from console.accounts.services import Actor
from tests.helpers import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def op(db):
    return make_user("tok-op", "operator")


def mint(user, **kwargs):
    kwargs.setdefault("name", "parent")
    return services.create_token(actor=Actor(user=user, name=user.username), **kwargs)


def post(raw: str, **body):
    body.setdefault("name", "child")
    return Client().post(
        "/api/v1/tokens",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {raw}",
    )


def test_model_limited_hour_token_cannot_mint_unlimited_never_expiring_child(op):
    hour = timezone.now() + timedelta(hours=1)
    parent, raw = mint(op, scope="write", expires_at=hour, allowed_models=["qwen"])

    r = post(raw, scope="write")  # nothing said: the parent's models and expiry
    assert r.status_code == 201, r.content
    child = ApiToken.objects.get(pk=r.json()["id"])
    assert child.allowed_models == ["qwen"] and child.expires_at == hour
    assert child.parent_id == parent.pk

    r = post(raw, allowed_models=["qwen", "llama"])
    assert r.status_code == 403 and r.json()["field"] == "allowed_models"
    later = (hour + timedelta(days=1)).isoformat()
    r = post(raw, expires_at=later)
    assert r.status_code == 403 and r.json()["field"] == "expires_at"
    sooner = hour - timedelta(minutes=30)
    r = post(raw, expires_at=sooner.isoformat(), allowed_models=["qwen"])
    assert r.status_code == 201
    assert ApiToken.objects.get(pk=r.json()["id"]).expires_at == sooner


def test_read_token_cannot_mint_a_write_token(op):
    _, raw = mint(op, scope="read")
    r = post(raw, scope="write")  # every write through a read token is refused first
    assert r.status_code == 403
    assert not ApiToken.objects.filter(name="child").exists()


def test_read_parent_refused_at_service_level_names_scope(op):
    parent, _ = mint(op, scope="read")
    actor = Actor(user=op, name="x", via="token", token=parent)
    with pytest.raises(services.Forbidden) as exc:
        services.create_token(actor=actor, name="c", scope="write")
    assert exc.value.field == "scope"


def test_unlimited_parent_keeps_the_old_freedom(op):
    _, raw = mint(op, scope="write")
    r = post(raw, scope="write", allowed_models=["any"])
    assert r.status_code == 201
    assert r.json()["expires_at"] is None


def test_session_created_tokens_have_no_parent(op):
    token, _ = mint(op)
    assert token.parent_id is None


def test_revoke_cascades_to_children_and_grandchildren_audited(op):
    parent, raw = mint(op, scope="write")
    child_id = post(raw, scope="write").json()["id"]
    child = ApiToken.objects.get(pk=child_id)
    actor = Actor(user=op, name="x", via="token", token=child)
    grandchild, graw = services.create_token(actor=actor, name="gc", scope="read")
    bystander, other_raw = mint(op, name="bystander")

    services.revoke_token(actor=Actor(user=op, name=op.username), token_id=parent.pk)

    for t in (parent, child, grandchild):
        t.refresh_from_db()
        assert t.revoked_at is not None, t.name
    bystander.refresh_from_db()
    assert bystander.revoked_at is None
    revoked = set(
        AuditEntry.objects.filter(action="token.revoke").values_list("object_id", flat=True)
    )
    assert revoked == {str(parent.pk), str(child.pk), str(grandchild.pk)}
    assert AuditEntry.objects.filter(
        action="token.revoke", object_id=str(grandchild.pk), message__contains="cascade"
    ).exists()
    # the descendants no longer authenticate
    me = Client().get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {graw}")
    assert me.status_code == 401
    assert Client().get("/api/v1/me", HTTP_AUTHORIZATION=f"Bearer {other_raw}").status_code == 200


def test_revoked_parent_cannot_mint(op):
    parent, _ = mint(op, scope="write")
    ApiToken.objects.filter(pk=parent.pk).update(revoked_at=timezone.now())
    actor = Actor(user=op, name="x", via="token", token=parent)  # stale, authenticated earlier
    with pytest.raises(services.Forbidden):
        services.create_token(actor=actor, name="late")
