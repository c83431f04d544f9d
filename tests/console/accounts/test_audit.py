"""The audit log is append-only and every state change writes one row."""

from __future__ import annotations

import pytest

from console.accounts.models import ApiToken, AuditEntry
from console.accounts.services import Actor, record


def test_audit_entries_cannot_be_changed_or_deleted(db):
    entry = record(actor=Actor.system(), action="test.thing", message="x")
    entry.message = "rewritten"
    with pytest.raises(ValueError):
        entry.save()
    with pytest.raises(ValueError):
        entry.delete()
    assert AuditEntry.objects.get(pk=entry.pk).message == "x"


def test_token_value_is_shown_once_and_only_its_hash_is_stored(viewer_client):
    resp = viewer_client.post(
        "/tokens/new", {"name": "laptop", "scope": "read", "expires": "30"}, follow=True
    )
    shown = resp.context["created"]["value"]
    assert shown.startswith("npc_")
    token = ApiToken.objects.get(name="laptop")
    assert shown not in (token.key_hash, token.hint) and len(token.key_hash) == 64
    assert "npc_" in resp.content.decode() and shown in resp.content.decode()
    again = viewer_client.get("/tokens/")
    assert shown not in again.content.decode()
    assert AuditEntry.objects.filter(action="token.create", actor="vera").exists()


def test_viewer_cannot_create_a_write_token(viewer_client):
    viewer_client.post("/tokens/new", {"name": "w", "scope": "write"})
    assert not ApiToken.objects.filter(name="w").exists()


def test_page_actions_record_who_and_from_where(operator_client):
    from tests.factories import make_node

    make_node("n1")
    resp = operator_client.post(
        "/nodes/n1/state", {"action": "drain", "reason": "kernel upgrade"}, REMOTE_ADDR="192.0.2.7"
    )
    assert resp.status_code == 302
    entry = AuditEntry.objects.get(action="node.status")
    assert (entry.actor, entry.via, entry.remote_addr, entry.message) == (
        "otto",
        "web",
        "192.0.2.7",
        "kernel upgrade",
    )
