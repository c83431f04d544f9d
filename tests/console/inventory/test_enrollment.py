"""Enrollment tokens (limits, validation) and node identity as admins see and change it."""

from __future__ import annotations

import secrets
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.errors import Forbidden, Invalid
from console.hot import get_redis
from console.inventory import identity
from console.inventory.enrollment import create_enrollment_token, revoke_enrollment_token
from console.inventory.models import EnrollmentToken, Node, NodeCredential
from tests.factories import make_node
from workers import channel


@pytest.fixture
def ada(admin_user):
    return Actor(user=admin_user, name="ada")


def token(ada, **kw) -> EnrollmentToken:
    return create_enrollment_token(actor=ada, name=kw.pop("name", "fleet"), **kw)[0]


def credential(node: Node, **fields) -> NodeCredential:
    return NodeCredential.objects.create(
        node=node, fingerprint=secrets.token_hex(8), issued_via="token fleet", **fields
    )


# --- token options ------------------------------------------------------------------------------
def test_a_token_can_be_single_use_limited_to_a_pattern_and_expire(ada):
    expires = timezone.now() + timedelta(hours=1)
    t = token(ada, max_uses=1, node_pattern=" rack-b-[0-9]* ", expires_at=expires)
    t.refresh_from_db()
    assert (t.max_uses, t.uses, t.node_pattern, t.expires_at) == (1, 0, "rack-b-[0-9]*", expires)
    entry = AuditEntry.objects.get(action="enrollment.create")
    assert "single use" in entry.message and "rack-b-[0-9]*" in entry.message


@pytest.mark.parametrize(
    "options, field",
    [
        ({"max_uses": 0}, "max_uses"),
        ({"max_uses": -3}, "max_uses"),
        ({"node_pattern": "Rack-*"}, "node_pattern"),  # node names are lowercase
        ({"node_pattern": "rack_b*"}, "node_pattern"),
        ({"node_pattern": "rack-[b"}, "node_pattern"),  # unclosed class
        ({"node_pattern": "rack/*"}, "node_pattern"),
        ({"node_pattern": "x" * 101}, "node_pattern"),
        ({"expires_at": timezone.now() - timedelta(seconds=1)}, "expires_at"),
        ({"name": "  "}, "name"),
    ],
)
def test_bad_token_options_are_refused_with_the_field(ada, options, field):
    with pytest.raises(Invalid) as exc:
        create_enrollment_token(actor=ada, name=options.pop("name", "fleet"), **options)
    assert exc.value.field == field
    assert not EnrollmentToken.objects.exists()


def test_only_admins_create_tokens(operator):
    with pytest.raises(Forbidden):
        create_enrollment_token(actor=Actor(user=operator, name="otto"), name="fleet")


def test_api_creates_a_limited_token_and_lists_its_use(admin_client_):
    body = {"name": "rack-b", "max_uses": 2, "node_pattern": "rack-b-*"}
    resp = admin_client_.post("/api/v1/enrollment-tokens", body, content_type="application/json")
    assert resp.status_code == 201, resp.content
    created = resp.json()
    assert created["token"].startswith("npe_")
    assert (created["max_uses"], created["uses"], created["node_pattern"]) == (2, 0, "rack-b-*")
    assert created["expires_at"] is None
    listed = admin_client_.get("/api/v1/enrollment-tokens").json()["items"][0]
    assert "token" not in listed and listed["node_pattern"] == "rack-b-*"


@pytest.mark.parametrize(
    "body, field", [({"max_uses": 0}, "max_uses"), ({"node_pattern": "a b"}, "node_pattern")]
)
def test_api_refuses_bad_options_with_422_naming_the_field(admin_client_, body, field):
    resp = admin_client_.post(
        "/api/v1/enrollment-tokens", {"name": "x", **body}, content_type="application/json"
    )
    assert resp.status_code == 422
    assert resp.json()["field"] == field


def test_enrollment_page_creates_a_single_use_expiring_token(admin_client_):
    resp = admin_client_.post(
        "/enrollment/new",
        {"name": "one host", "single_use": "1", "max_uses": "7", "node_pattern": "kp-0?"}
        | {"expires_in_h": "24"},
    )
    assert resp.status_code == 302
    t = EnrollmentToken.objects.get()
    assert (t.max_uses, t.node_pattern) == (1, "kp-0?")  # "single use" wins over max uses
    assert timedelta(hours=23) < t.expires_at - timezone.now() <= timedelta(hours=24)
    page = admin_client_.get("/enrollment/").content.decode()
    assert "kp-0?" in page and "0 / 1" in page and "never travels" in page


def test_enrollment_page_says_what_is_wrong_with_the_form(admin_client_):
    admin_client_.post("/enrollment/new", {"name": "x", "max_uses": "many"})
    admin_client_.post("/enrollment/new", {"name": "x", "node_pattern": "A*"})
    assert not EnrollmentToken.objects.exists()
    page = admin_client_.get("/enrollment/").content.decode()
    assert "max uses: a whole number" in page and "node pattern:" in page


def test_a_revoked_token_stops_new_enrollments_only(ada):
    t = token(ada)
    node = make_node("kp-01", enrolled_with=t)
    cred = credential(node)
    revoke_enrollment_token(actor=ada, token_id=t.pk)
    t.refresh_from_db()
    assert identity.enrollment_refusal(t, None, "kp-02") == (
        "the enrollment token is expired or revoked"
    )
    cred.refresh_from_db()
    assert cred.is_active()  # the enrolled node keeps its own credential


# --- who may enroll -------------------------------------------------------------------------------
def test_refusal_rules_of_the_token_itself(ada):
    refuse = identity.enrollment_refusal
    assert refuse(token(ada, node_pattern="rack-b-*"), None, "rack-a-01") == (
        "this token may enroll only nodes matching 'rack-b-*'"
    )
    assert refuse(token(ada, node_pattern="rack-b-*"), None, "rack-b-01") is None
    used = token(ada, max_uses=1)
    assert refuse(used, None, "kp-01") is None
    EnrollmentToken.objects.filter(pk=used.pk).update(uses=1)
    used.refresh_from_db()
    assert refuse(used, None, "kp-01") == "this enrollment token has been used up"
    expired = token(ada, expires_at=timezone.now() + timedelta(seconds=5))
    EnrollmentToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now())
    expired.refresh_from_db()
    assert "expired or revoked" in refuse(expired, None, "kp-01")


def test_an_enrolled_node_needs_an_admin_to_enroll_again(ada):
    t = token(ada)
    node = make_node("kp-01", enrolled_with=t)
    cred = credential(node)
    assert "already enrolled" in identity.enrollment_refusal(t, node, "kp-01")
    identity.revoke_credential(actor=ada, name="kp-01", reason="stolen disk")
    cred.refresh_from_db()
    assert cred.revoked_reason == "stolen disk"
    node.refresh_from_db()
    assert "was revoked" in identity.enrollment_refusal(t, node, "kp-01")
    node = identity.allow_reenrollment(actor=ada, name="kp-01")
    assert identity.enrollment_refusal(t, node, "kp-01") is None
    assert identity.enrollment_refusal(token(ada, name="other"), node, "kp-01") is None


def test_a_node_registered_before_identities_upgrades_with_its_own_token_only(ada):
    own, other = token(ada, name="own"), token(ada, name="other")
    node = make_node("kp-01", enrolled_with=own)  # no credential: registered by heartbeats
    assert identity.enrollment_refusal(own, node, "kp-01") is None
    assert identity.enrollment_refusal(other, node, "kp-01") == (
        "node kp-01 was registered with another enrollment token"
    )


def enroll(raw_token: str, node: str) -> dict:
    """One agent request through identity.handle_enrollment, answered in Redis."""
    private, public = channel.dh_keypair()
    rid = secrets.token_hex(32)
    doc = {"v": channel.PROTOCOL, "n": node, "hint": raw_token[:10], "rid": rid}
    doc |= {"dh": format(public, "x"), "t": time.time(), "agent_version": "1.4.0"}
    identity.handle_enrollment(channel.seal(channel.token_mac_key(raw_token), doc))
    r = get_redis()
    _, _, answer = channel.unseal_unverified(r.lpop(channel.enroll_reply_key(rid)))
    if answer.get("ok"):
        shared = pow(int(answer["dh"], 16), private, channel.DH_P)
        answer["key"] = channel.wrap_key(bytes.fromhex(answer["wrapped"]), shared, rid)
    return answer


def test_a_single_use_pattern_token_enrolls_one_matching_node(ada, redis_url):
    _, raw = create_enrollment_token(actor=ada, name="b", max_uses=1, node_pattern="rack-b-*")
    assert "matching 'rack-b-*'" in enroll(raw, "rack-a-01")["error"]
    answer = enroll(raw, "rack-b-01")
    assert answer["ok"], answer
    cred = NodeCredential.objects.get(node__name="rack-b-01")
    assert answer["kid"] == cred.pk and answer["key"] == identity.node_key("rack-b-01", cred.pk)
    assert cred.fingerprint == channel.fingerprint(answer["key"])
    assert EnrollmentToken.objects.get().uses == 1
    assert enroll(raw, "rack-b-02")["error"] == "this enrollment token has been used up"
    assert not Node.objects.filter(name="rack-b-02").exists()


# --- admins: see, rotate, revoke, allow re-enrollment ---------------------------------------------
def test_rotate_issues_a_second_credential_and_the_first_gets_a_grace_period(
    ada, redis_url, django_capture_on_commit_callbacks
):
    node = make_node("kp-01")
    first = credential(node)
    r = get_redis()
    r.delete(channel.cmd_key("kp-01"))
    with django_capture_on_commit_callbacks(execute=True):
        new = identity.rotate_credential(actor=ada, name="kp-01")
    first.refresh_from_db()
    assert new.pk != first.pk and new.grace_until is None and new.is_active()
    assert first.grace_until is not None and first.revoked_at is None and first.is_active()
    assert first.grace_until <= timezone.now() + identity.ROTATION_GRACE
    assert r.llen(channel.cmd_key("kp-01")) == 1  # the new key, sent under the old one
    r.delete(channel.cmd_key("kp-01"))


def test_api_lists_credentials_to_admins_without_keys(admin_client_, operator_client):
    node = make_node("kp-01")
    cred = credential(node)
    resp = admin_client_.get("/api/v1/nodes/kp-01/credentials")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["node"] == "kp-01" and body["reenroll_allowed"] is False
    [listed] = body["credentials"]
    assert listed["fingerprint"] == cred.fingerprint and listed["active"] is True
    assert set(listed) == {
        "id",
        "fingerprint",
        "issued_at",
        "issued_via",
        "last_used_at",
        "grace_until",
        "revoked_at",
        "revoked_reason",
        "active",
    }
    assert operator_client.get("/api/v1/nodes/kp-01/credentials").status_code == 403
    assert admin_client_.get("/api/v1/nodes/nope/credentials").status_code == 404


@pytest.mark.parametrize(
    "path, body",
    [
        ("credentials/rotate", {}),
        ("credentials/revoke", {"reason": "x"}),
        ("reenroll", {}),
    ],
)
def test_operators_cannot_change_a_node_identity(operator_client, path, body):
    node = make_node("kp-01")
    cred = credential(node)
    resp = operator_client.post(
        f"/api/v1/nodes/kp-01/{path}", body, content_type="application/json"
    )
    assert resp.status_code == 403
    cred.refresh_from_db()
    assert (cred.revoked_at, cred.grace_until) == (None, None)
    assert NodeCredential.objects.count() == 1
    assert not Node.objects.get().reenroll_allowed


def test_api_rotate_answers_the_new_credential(admin_client_, redis_url):
    node = make_node("kp-01")
    first = credential(node)
    resp = admin_client_.post("/api/v1/nodes/kp-01/credentials/rotate")
    assert resp.status_code == 200, resp.content
    new = resp.json()
    assert new["id"] != first.pk and new["active"] and new["issued_via"] == "rotation by ada"
    assert "key" not in new
    make_node("kp-02")
    resp = admin_client_.post("/api/v1/nodes/kp-02/credentials/rotate")
    assert resp.status_code == 409  # nothing to rotate


def test_api_revoke_sets_revoked_at_and_changes_nothing_else(admin_client_, ada):
    t = token(ada)
    node = make_node("kp-01", enrolled_with=t)
    cred = credential(node)
    other = credential(make_node("kp-02"))
    resp = admin_client_.post(
        "/api/v1/nodes/kp-01/credentials/revoke",
        {"reason": "host decommissioned"},
        content_type="application/json",
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["revoked"] == 1 and body["reenroll_allowed"] is False
    assert body["credentials"][0]["revoked_reason"] == "host decommissioned"
    cred.refresh_from_db()
    other.refresh_from_db()
    assert cred.revoked_at is not None and cred.grace_until is None
    assert other.revoked_at is None
    assert EnrollmentToken.objects.get().uses == 0 and EnrollmentToken.objects.get().is_active()
    node.refresh_from_db()
    assert (node.status, node.reenroll_allowed) == ("online", False)
    assert AuditEntry.objects.filter(action="node.credential.revoke").count() == 1
    again = admin_client_.post(
        "/api/v1/nodes/kp-01/credentials/revoke",
        {"reason": "again"},
        content_type="application/json",
    )
    assert again.json()["revoked"] == 0


def test_api_allows_reenrollment(admin_client_):
    make_node("kp-01")
    resp = admin_client_.post("/api/v1/nodes/kp-01/reenroll")
    assert resp.status_code == 200, resp.content
    assert resp.json()["reenroll_allowed"] is True
    assert Node.objects.get().reenroll_allowed
    assert AuditEntry.objects.filter(action="node.allow_reenroll").exists()


# --- the node page --------------------------------------------------------------------------------
def test_node_page_shows_the_identity_panel_to_admins_only(
    admin_client_, viewer_client, operator_client
):
    node = make_node("kp-01")
    cred = credential(node)
    credential(node, revoked_at=timezone.now(), revoked_reason="replaced by a new enrollment")
    page = admin_client_.get("/nodes/kp-01/").content.decode()
    assert 'data-testid="node-identity"' in page
    assert cred.fingerprint in page and "replaced by a new enrollment" in page
    for client in (viewer_client, operator_client):
        page = client.get("/nodes/kp-01/").content.decode()
        assert 'data-testid="node-identity"' not in page and cred.fingerprint not in page


def test_node_page_buttons_revoke_and_allow_reenrollment(admin_client_, operator_client):
    node = make_node("kp-01")
    cred = credential(node)
    assert operator_client.post("/nodes/kp-01/credentials/revoke").status_code == 403
    resp = admin_client_.post("/nodes/kp-01/credentials/revoke", {"reason": "lost laptop"})
    assert resp.status_code == 302
    cred.refresh_from_db()
    assert cred.revoked_reason == "lost laptop"
    admin_client_.post("/nodes/kp-01/reenroll")
    assert Node.objects.get().reenroll_allowed
    page = admin_client_.get("/nodes/kp-01/").content.decode()
    assert "may enroll again once" in page and "lost laptop" in page


def test_node_page_rotate_without_a_credential_says_why(admin_client_):
    make_node("kp-01")
    admin_client_.post("/nodes/kp-01/credentials/rotate")
    page = admin_client_.get("/nodes/kp-01/").content.decode()
    assert "no active credential to rotate" in page
