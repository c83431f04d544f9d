"""Promise: enrollment cannot be used to take over a node. A host with Redis access and an
enrollment token of its own (another rack's) cannot obtain the credential of a node already
enrolled, revoked or registered with another token, cannot enroll outside its token's pattern,
reuse a single-use, expired or revoked token; a request MAC'd with a token the console does not
hold gets no answer at all; and an answer read by anyone but its requester does not give up
the node key (it is wrapped under a Diffie-Hellman secret).

Requests are built exactly as `workers.channel.request_enrollment` builds them and handed to
`console.inventory.identity.handle_enrollment`, what the consumer does with `npc:enroll`; one
test runs the whole round trip through Redis.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from console.accounts.services import Actor
from console.hot import get_redis
from console.inventory.enrollment import issue_enrollment_token
from console.inventory.identity import allow_reenrollment, handle_enrollment, node_key
from console.inventory.models import EnrollmentToken, Node, NodeCredential
from tests.factories import make_node
from tests.node_support import enroll_node
from workers import channel

pytestmark = [pytest.mark.security, pytest.mark.django_db]
SYSTEM = Actor.system("tests")


def token(name: str, **kw) -> tuple[EnrollmentToken, str]:
    return issue_enrollment_token(actor=SYSTEM, name=name, **kw)


def request(node: str, raw_token: str, *, dh: int | None = None, t: float | None = None):
    """(message, DH private key, reply id): an enrollment request as the agent seals it."""
    private, public = channel.dh_keypair()
    rid = secrets.token_hex(32)
    doc = {
        "v": channel.PROTOCOL,
        "n": node,
        "hint": raw_token[:10],
        "rid": rid,
        "dh": format(public if dh is None else dh, "x"),
        "t": time.time() if t is None else t,
        "agent_version": "0.2.0",
    }
    return channel.seal(channel.token_mac_key(raw_token), doc), private, rid


def answer(rid: str, raw_token: str) -> dict | None:
    """The console's answer on the reply key, checked as the agent checks it (None: none)."""
    raw = get_redis().lpop(channel.enroll_reply_key(rid))
    if raw is None:
        return None
    mac, data, doc = channel.unseal_unverified(raw)
    assert channel.verify(channel.token_mac_key(raw_token), mac, data)
    return doc


def unwrap(doc: dict, private: int, rid: str) -> bytes:
    shared = pow(int(doc["dh"], 16), private, channel.DH_P)
    return channel.wrap_key(bytes.fromhex(doc["wrapped"]), shared, rid)


def state(name: str) -> tuple:
    """What a takeover would change: the node row and its credentials."""
    node = Node.objects.filter(name=name).values("pk", "reenroll_allowed", "enrolled_with_id")
    creds = NodeCredential.objects.filter(node__name=name).values_list("pk", "revoked_at")
    return list(node), sorted(creds)


@pytest.fixture
def victim():
    """Node A, enrolled the normal way with rack A's token."""
    return enroll_node(f"rack-a-{secrets.token_hex(3)}")


def attempt(node: str, raw_token: str, **kw) -> tuple[str, dict | None, int, str]:
    raw, private, rid = request(node, raw_token, **kw)
    return handle_enrollment(raw), answer(rid, raw_token), private, rid


def test_another_racks_token_cannot_take_over_an_enrolled_node(victim):
    _, rack_b = token("rack b", node_pattern="rack-*")  # broad enough to name A
    before = state(victim.node)
    outcome, doc, _, _ = attempt(victim.node, rack_b)
    assert outcome.startswith("refused:") and "already enrolled" in outcome
    assert doc == {"v": 1, "rid": doc["rid"], "ok": False, "error": doc["error"]}
    assert "wrapped" not in doc and "kid" not in doc
    assert state(victim.node) == before


def test_a_replayed_enrollment_request_of_the_node_itself_gets_nothing():
    """The host read A's own enrollment request off `npc:enroll` and pushes it again: the
    console answers that request again with the same credential (what an agent whose answer
    was lost needs), wrapped for A's key-exchange value — nothing changes, nothing is learnt."""
    _, raw = token("rack a")
    name = f"rack-a-{secrets.token_hex(3)}"
    captured, _, rid = request(name, raw)
    assert handle_enrollment(captured) == "issued"
    answer(rid, raw)
    before = state(name)
    assert handle_enrollment(captured) == "answered again"
    assert state(name) == before


def test_a_revoked_node_needs_an_admin_before_any_token_enrolls_it(victim, admin_user):
    NodeCredential.objects.filter(node__name=victim.node).update(revoked_at=timezone.now())
    _, rack_b = token("rack b")
    before = state(victim.node)
    outcome, _, _, _ = attempt(victim.node, rack_b)
    assert "revoked" in outcome and "admin" in outcome
    assert state(victim.node) == before
    # positive control: once an admin allows it, the node enrolls again (once)
    allow_reenrollment(actor=Actor(user=admin_user, name="ada"), name=victim.node)
    assert attempt(victim.node, rack_b)[0] == "issued"
    assert "already enrolled" in attempt(victim.node, rack_b)[0]


def test_a_node_registered_before_identity_upgrades_only_with_its_own_token():
    own, own_raw = token("old rack a")
    old = make_node(f"old-{secrets.token_hex(3)}", enrolled_with=own)
    _, rack_b = token("rack b")
    outcome, _, _, _ = attempt(old.name, rack_b)
    assert "registered with another enrollment token" in outcome
    assert not old.credentials.exists()
    assert attempt(old.name, own_raw)[0] == "issued"  # the upgrade path still works


@pytest.mark.parametrize(
    "name",
    ["rack-a-01", "rack-b", "rack-b-*", "RACK-B-01", "rack-b-01.evil", "rack-b-01/../a", ""],
)
def test_a_pattern_limited_token_enrolls_nothing_outside_its_pattern(name):
    _, rack_b = token("rack b", node_pattern="rack-b-*")
    outcome, doc, _, _ = attempt(name, rack_b)
    assert outcome.startswith("refused:"), outcome
    assert doc["ok"] is False
    assert not Node.objects.filter(name=name).exists()


def test_a_single_use_token_works_once():
    row, raw = token("one host", max_uses=1)
    assert attempt("single-01", raw)[0] == "issued"
    outcome, _, _, _ = attempt("single-02", raw)
    assert "used up" in outcome
    assert not Node.objects.filter(name="single-02").exists()
    assert EnrollmentToken.objects.get(pk=row.pk).uses == 1


@pytest.mark.parametrize("how", ["expired", "revoked"])
def test_an_expired_or_revoked_token_enrolls_nothing(how):
    row, raw = token("old")
    field = "expires_at" if how == "expired" else "revoked_at"
    EnrollmentToken.objects.filter(pk=row.pk).update(**{field: timezone.now() - timedelta(1)})
    outcome, doc, _, _ = attempt("late-01", raw)
    assert "expired or revoked" in outcome and doc["ok"] is False
    assert not Node.objects.filter(name="late-01").exists()


def test_a_request_macd_with_an_unknown_token_gets_no_answer(victim):
    row, raw = token("real")
    forged = raw[:10] + secrets.token_urlsafe(32)  # right hint, wrong secret
    for guess in (forged, "npc_" + secrets.token_urlsafe(32), ""):
        outcome, doc, _, rid = attempt(victim.node, guess)
        assert outcome.startswith("dropped:") and doc is None
        assert not get_redis().exists(channel.enroll_reply_key(rid))
    assert EnrollmentToken.objects.get(pk=row.pk).uses == 0


def test_stale_junk_and_bad_key_exchange_requests_are_refused(victim):
    _, raw = token("rack b")
    assert attempt("fresh-01", raw, t=time.time() - 600)[0].startswith("dropped:")
    assert attempt("fresh-01", raw, t=time.time() + 3600)[0].startswith("dropped:")
    for bad in (0, 1, channel.DH_P - 1, channel.DH_P, channel.DH_P + 2):
        outcome, doc, _, _ = attempt("fresh-01", raw, dh=bad)
        assert "key-exchange" in outcome and doc["ok"] is False
    for junk in (
        b"",
        b"x" * (channel.MAX_MESSAGE_BYTES + 1),
        b"0" * 64 + b".[]",
        b"0" * 64 + b'.{"v":1}',
    ):
        assert handle_enrollment(junk).startswith("dropped:")
    assert not Node.objects.filter(name="fresh-01").exists()


def test_the_answer_gives_the_key_to_its_requester_only():
    """Anyone who reads the answer off Redis (no ACLs, or MONITOR) sees the wrapped key and the
    console's DH value; without the requester's private exponent it unwraps to garbage."""
    _, raw = token("rack a")
    name = f"dh-{secrets.token_hex(3)}"
    message, private, rid = request(name, raw)
    assert handle_enrollment(message) == "issued"
    reply = get_redis().lindex(channel.enroll_reply_key(rid), 0)
    doc = answer(rid, raw)
    key = node_key(name, doc["kid"])

    assert unwrap(doc, private, rid) == key  # the requester
    assert key.hex().encode() not in reply and key not in reply
    eavesdropper, _ = channel.dh_keypair()
    assert unwrap(doc, eavesdropper, rid) != key  # a reader with its own exponent
    assert channel.wrap_key(bytes.fromhex(doc["wrapped"]), 0, rid) != key
    assert bytes.fromhex(doc["wrapped"]) != key


def test_round_trip_through_redis_answers_only_the_token_holder():
    """request_enrollment against Redis, with the consumer's enrollment step answering."""
    _, raw = token("rack b", node_pattern="rack-b-*")
    r = get_redis()
    results: dict[str, object] = {}

    def agent(label, node, raw_token, timeout):
        try:
            results[label] = channel.request_enrollment(
                r, node=node, raw_token=raw_token, agent_version="0.2.0", timeout=timeout
            )
        except (channel.Refused, TimeoutError) as exc:
            results[label] = exc

    runs = [
        threading.Thread(target=agent, args=("good", "rack-b-07", raw, 10)),
        threading.Thread(target=agent, args=("forged", "rack-b-08", raw + "x", 1.5)),
        threading.Thread(target=agent, args=("outside", "rack-c-01", raw, 10)),
    ]
    for t in runs:
        t.start()
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in runs) and time.monotonic() < deadline:
        for item in r.lpop(channel.ENROLL_KEY, 20) or []:
            handle_enrollment(item)
        time.sleep(0.02)
    for t in runs:
        t.join(5)

    good = results["good"]
    assert isinstance(good, channel.Identity) and good.key == node_key("rack-b-07", good.kid)
    assert isinstance(results["forged"], TimeoutError)  # no answer at all
    assert isinstance(results["outside"], channel.Refused) and "rack-b-*" in str(results["outside"])
    assert set(Node.objects.values_list("name", flat=True)) >= {"rack-b-07"}
    assert not Node.objects.filter(name__in=["rack-b-08", "rack-c-01"]).exists()
