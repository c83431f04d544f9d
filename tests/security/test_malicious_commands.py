"""Promise: only the console commands an agent. A host with Redis access that pushes onto
another node's command list (`npc:cmd:<A>`) — unsigned, signed with its own key, a command the
console signed for another node, tampered, stale, or a replay of one it read — is refused by
A's agent; and a forged answer on A's reply key is not taken for A's by the console.

In-process, against `workers.channel.AgentChannel` (what the agent's command loop calls) and
`console.inventory.commands.call`. The same through a real agent: test_malicious_host_e2e.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from console.hot import get_redis
from console.inventory import commands
from console.inventory.identity import node_key
from tests.helpers import wait_for
from tests.node_support import enroll_node
from workers import channel
from workers.contracts import Tasks

pytestmark = [pytest.mark.security, pytest.mark.django_db]


@pytest.fixture
def nodes():
    import secrets

    suffix = secrets.token_hex(3)
    return enroll_node(f"cmd-a-{suffix}"), enroll_node(f"cmd-b-{suffix}")


def signed(identity, *, key=None, node=None, task=Tasks.HOST_STOP_REPLICA, args=(7, 1), **doc):
    cmd_id, raw = channel.command(
        key if key is not None else identity.key,
        node=node or identity.node,
        kid=identity.kid,
        task=task,
        args=list(args),
    )
    if not doc:
        return raw
    body = json.loads(raw.partition(b".")[2]) | doc
    return channel.seal(key if key is not None else identity.key, body)


def refusal(agent: channel.AgentChannel, raw: bytes) -> str:
    with pytest.raises(channel.Refused) as exc:
        agent.verify_command(raw)
    return exc.value.code


def test_agent_refuses_every_command_the_console_did_not_sign_for_it(nodes):
    a, b = nodes
    agent = channel.AgentChannel(get_redis(), a)
    genuine = signed(a)
    mac, _, data = genuine.partition(b".")
    tampered = json.loads(data) | {"k": Tasks.HOST_START_REPLICA}
    cases = {
        "unsigned": (b"0" * 64 + b"." + data, "signature"),
        "no MAC": (data, "malformed"),
        "signed with B's key, naming A": (signed(a, key=b.key), "signature"),
        "B's genuine command": (signed(b), "signature"),
        "B's key, B's kid, naming A": (signed(b, node=a.node), "signature"),
        "tampered name": (mac + b"." + json.dumps(tampered).encode(), "signature"),
        "signed for A but addressed to B": (signed(a, node=b.node), "wrong-node"),
        "two hours old": (signed(a, t=time.time() - 7200), "stale"),
        "from 2099": (signed(a, t=4_080_000_000.0), "future"),
        "args that are not a list": (
            signed(a, x=channel.encrypt_args(a.key, "z", [1])),
            "malformed",
        ),
        "junk": (b"x" * (channel.MAX_MESSAGE_BYTES + 1), "too-large"),
    }
    for label, (raw, code) in cases.items():
        assert refusal(agent, raw) == code, label
    assert agent.verify_command(genuine)["a"] == [7, 1]  # the real one still runs


def test_agent_refuses_a_replayed_command(nodes):
    a, _ = nodes
    agent = channel.AgentChannel(get_redis(), a)
    observed = signed(a, task=Tasks.HOST_START_REPLICA, args=[{"replica_id": 1}])
    assert agent.verify_command(observed)["k"] == Tasks.HOST_START_REPLICA
    assert refusal(agent, observed) == "replay"


def test_agent_refuses_a_replayed_command_after_a_restart(nodes, tmp_path):
    """A command read off npc:cmd:<node> (no ACLs: MONITOR or LRANGE) and pushed again after
    the agent restarts is refused: the ids run within the last hour are kept in the state dir."""
    a, _ = nodes
    seen = tmp_path / "commands-seen.json"
    observed = signed(a, task=Tasks.HOST_START_REPLICA, args=[{"replica_id": 1}])
    channel.AgentChannel(get_redis(), a, seen_path=seen).verify_command(observed)
    assert oct(seen.stat().st_mode & 0o777) == "0o600"
    restarted = channel.AgentChannel(get_redis(), a, seen_path=seen)
    assert refusal(restarted, observed) == "replay"


def test_arguments_travel_encrypted_for_their_node(nodes):
    """A reader of another node's queue learns no engine key from a start command."""
    a, b = nodes
    secret = "engine-key-" + "k" * 24
    raw = signed(a, task=Tasks.HOST_START_REPLICA, args=[{"api_key": secret}])
    assert secret.encode() not in raw
    doc = json.loads(raw.partition(b".")[2])
    with pytest.raises((ValueError, UnicodeDecodeError)):
        channel.decrypt_args(b.key, doc["id"], doc["x"])


def test_console_takes_no_forged_answer_for_the_node(nodes):
    """B writes answers on A's reply key (signed with its own key, with A's kid, unsigned);
    the console waits for A's own and returns that."""
    a, b = nodes
    r = get_redis()
    a_key = node_key(a.node, a.kid)

    def reply(cmd_id, identity, sign_key, body):
        doc = {"v": 1, "n": a.node, "kid": identity.kid, "id": cmd_id, "t": time.time(), "b": body}
        return channel.seal(sign_key, doc)

    def hosts():  # B answers first, from the command it read; then A's agent answers
        queued = wait_for(lambda: r.lpop(channel.cmd_key(a.node)), 5, message="the command")
        cmd_id = json.loads(queued.partition(b".")[2])["id"]
        key = channel.reply_key(a.node, cmd_id)
        r.rpush(key, reply(cmd_id, b, b.key, {"pong": "forged by B"}))
        r.rpush(key, reply(cmd_id, a, b.key, {"pong": "forged with A's kid"}))
        r.rpush(key, b"0" * 64 + b'.{"v":1,"b":{"pong":"unsigned"}}')
        r.rpush(key, reply("other", a, a_key, {"pong": "A's answer to another command"}))
        r.rpush(key, reply(cmd_id, a, a_key, {"pong": "x"}))

    answering = threading.Thread(target=hosts)
    answering.start()
    try:
        assert commands.call(a.node, Tasks.HOST_PING, ["x"], timeout=10) == {"pong": "x"}
    finally:
        answering.join(10)
