"""The console's end of the signed channel: the real enrollment exchange over Redis, the
consumer's batches, lease and crash recovery, replay state across restarts, revocation and
rotation, refusal counters on /metrics (console/inventory/inbox.py, identity.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from django.conf import settings

from console.accounts.services import Actor
from console.inventory import identity
from console.inventory.enrollment import issue_enrollment_token
from console.inventory.inbox import LEADER_KEY, PROCESSING_KEY, Consumer, Inbox, refusal_counts
from console.inventory.models import Node, NodeCredential
from tests.console.inventory.test_heartbeats import beat
from tests.node_support import deliver, enroll_node, sealed
from workers import channel
from workers.contracts import Tasks

pytestmark = pytest.mark.security


def _beat(identity_: channel.Identity, **extra) -> bytes:
    return sealed(identity_, Tasks.HEARTBEAT, beat("unused", node=identity_.node, **extra))


def _step_until(consumer: Consumer, done, steps: int = 50) -> None:
    for _ in range(steps):
        consumer.step(block_s=0.1)
        if done():
            return
    raise AssertionError("the consumer never got there")


@pytest.mark.django_db(transaction=True)
def test_an_agent_enrolls_over_redis_and_its_key_is_the_consoles(hot):
    """The real exchange: request_enrollment (the agent) against Consumer.step (the console)."""
    token, raw = issue_enrollment_token(actor=Actor.system("t"), name="rack-a")
    consumer = Consumer(hot)
    got: dict = {}

    def agent():
        got["identity"] = channel.request_enrollment(
            hot, node="kp-07", raw_token=raw, agent_version="0.2.0", timeout=20
        )

    thread = threading.Thread(target=agent)
    thread.start()
    _step_until(consumer, lambda: not thread.is_alive() or "identity" in got)
    thread.join(10)
    ident = got["identity"]
    cred = NodeCredential.objects.get(node__name="kp-07")
    assert ident.kid == cred.pk and ident.key == identity.node_key("kp-07", cred.pk)
    assert cred.fingerprint == channel.fingerprint(ident.key)
    assert Node.objects.get(name="kp-07").enrolled_with_id == token.pk
    # the token never crossed Redis; the key neither (wrapped under the DH secret)
    assert not any(
        raw.encode() in (hot.get(k) or b"")
        for k in hot.scan_iter("npc:*")
        if hot.type(k) == b"string"
    )
    # and the node speaks at once
    assert deliver(_beat(ident), inbox=consumer.inbox)["ok"] == 1


@pytest.mark.django_db(transaction=True)
def test_a_refused_enrollment_is_answered_with_the_reason(hot):
    _, raw = issue_enrollment_token(actor=Actor.system("t"), name="rack-b")
    enroll_node("kp-01")
    consumer = Consumer(hot)
    errors: list = []

    def agent():
        try:
            channel.request_enrollment(hot, node="kp-01", raw_token=raw, agent_version="0.2.0")
        except channel.Refused as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=agent)
    thread.start()
    _step_until(consumer, lambda: bool(errors))
    thread.join(10)
    assert errors == ["node kp-01 is already enrolled; an admin must allow it to enroll again"]


@pytest.mark.django_db
def test_a_batch_left_by_a_killed_consumer_is_handled_by_the_next_once(hot):
    node = enroll_node("kp-01")
    hot.rpush(PROCESSING_KEY, _beat(node))  # what a consumer killed mid-batch leaves behind
    consumer = Consumer(hot)
    assert consumer.hold_lease()
    assert hot.llen(PROCESSING_KEY) == 0
    assert Node.objects.get(name="kp-01").status == "online"


@pytest.mark.django_db
def test_only_the_lease_holder_consumes(hot):
    node = enroll_node("kp-01")
    first, second = Consumer(hot), Consumer(hot)
    assert first.hold_lease() and not second.hold_lease()
    assert first.hold_lease()  # renewing
    hot.rpush(channel.INBOX_KEY, _beat(node))
    assert first.step(block_s=0.1) == 1
    hot.delete(LEADER_KEY)  # the holder died; its lease lapsed
    assert second.hold_lease()


@pytest.mark.django_db
def test_a_replay_is_refused_after_a_console_restart(hot):
    node = enroll_node("kp-01")
    raw = _beat(node)
    assert deliver(raw)["ok"] == 1
    assert deliver(raw, inbox=Inbox())["replay"] == 1  # a new process reads the seqs back


@pytest.mark.django_db
def test_a_node_enrolled_a_moment_ago_is_heard_at_once(hot):
    """Its first message may come within the cache's second: a miss looks at the version again."""
    inbox = Inbox()
    assert deliver(_beat(enroll_node("kp-01")), inbox=inbox)["ok"] == 1  # cache checked now
    late = enroll_node("kp-02")
    identity.bump_version()  # on_commit in production; the test's transaction never commits
    inbox.creds.miss_check_s = 0.0  # (production: 50 ms between two looks on a miss)
    assert deliver(_beat(late), inbox=inbox)["ok"] == 1


@pytest.mark.django_db
def test_a_revoked_node_is_cut_off_at_the_next_batch(hot, admin_user):
    node = enroll_node("kp-01")
    inbox = Inbox()
    assert deliver(_beat(node), inbox=inbox)["ok"] == 1
    identity.revoke_credential(actor=Actor(user=admin_user, name="ada"), name="kp-01", reason="x")
    identity.bump_version()  # on_commit in production; the test's transaction never commits
    inbox.creds._checked = -1e9  # the next batch (at most a second later) checks the version
    assert deliver(_beat(node), inbox=inbox)["identity"] == 1
    assert refusal_counts()["identity"] == 1


@pytest.mark.django_db
def test_a_rotated_credential_replaces_the_old_once_the_agent_uses_it(hot, admin_user, tmp_path):
    """Rotation end to end in-process: the console's signed command, the agent's handler,
    the first message signed with the new key retires the old one."""
    from workers.agent import Agent

    node = enroll_node("kp-01")
    new = identity.rotate_credential(actor=Actor(user=admin_user, name="ada"), name="kp-01")
    old = NodeCredential.objects.get(pk=node.kid)
    assert old.grace_until is not None and old.revoked_at is None
    # what the on-commit hook sends (the test's transaction never commits)
    wrapped = channel.wrap_key(
        identity.node_key("kp-01", new.pk), int.from_bytes(node.key, "big"), f"rotate:{new.pk}"
    )
    _, raw = channel.command(
        node.key,
        node="kp-01",
        kid=node.kid,
        task="host.rotate_credential",
        args=[new.pk, wrapped.hex()],
    )
    agent_channel = channel.AgentChannel(hot, node)
    command = agent_channel.verify_command(raw)
    agent = SimpleNamespace(
        channel=agent_channel,
        config=SimpleNamespace(state_dir=tmp_path, broker_url=settings.REDIS_URL),
        send=agent_channel.send,
    )
    Agent.rotate(agent, *command["a"])
    assert channel.Identity.load(tmp_path / "identity.json").kid == new.pk
    inbox = Inbox()
    assert deliver(*hot.lpop(channel.INBOX_KEY, 10), inbox=inbox)["ok"] == 1  # "rotated"
    old.refresh_from_db()
    assert old.revoked_at is not None and old.revoked_reason == "rotated"
    identity.bump_version()
    inbox.creds._checked = -1e9
    assert deliver(_beat(node), inbox=inbox)["identity"] == 1  # the old key is dead
    assert deliver(_beat(agent_channel.identity), inbox=inbox)["ok"] == 1


@pytest.mark.django_db
def test_refusals_show_on_metrics_by_reason(hot, admin_user):
    from console.telemetry.prometheus import render_metrics

    node = enroll_node("kp-01")
    deliver(b"junk", sealed(node, Tasks.HEARTBEAT, {}, key=bytes(32)))
    text = render_metrics()
    assert 'npc_node_refusals_total{reason="malformed"} 1' in text
    assert 'npc_node_refusals_total{reason="signature"} 1' in text


@pytest.mark.django_db
def test_an_agent_of_the_old_unsigned_protocol_is_refused_and_counted(hot):
    from console.inventory.tasks import heartbeat

    heartbeat({"node": "kp-01", "enroll_token": "npe_x"})
    assert refusal_counts() == {"old-protocol": 1}
    assert not Node.objects.exists()


@pytest.mark.django_db
def test_an_answer_that_comes_after_the_agent_gave_up_waiting_is_not_lost(hot):
    """The console was slow (down, busy): the agent's wait timed out and it asks again with the
    same request — it gets the credential issued for the first ask, not a refusal."""
    _, raw = issue_enrollment_token(actor=Actor.system("t"), name="rack-a")
    enrollment = channel.Enrollment(node="kp-09", raw_token=raw, agent_version="0.2.0")
    with pytest.raises(TimeoutError):
        enrollment.attempt(hot, wait=1)  # no console yet
    consumer = Consumer(hot)
    consumer.step(block_s=0.1)  # the console answers the first request; nobody reads it yet
    enrollment.RESEND_S = 0  # the agent's retry sends the same request again
    consumer_thread = threading.Thread(
        target=lambda: [consumer.step(block_s=0.5) for _ in range(6)]
    )
    consumer_thread.start()
    got = enrollment.attempt(hot, wait=10)
    consumer_thread.join(10)
    (cred,) = NodeCredential.objects.filter(node__name="kp-09")
    assert got.kid == cred.pk and got.key == identity.node_key("kp-09", cred.pk)
    assert cred.revoked_at is None  # the second ask changed nothing
