"""The signed channel's pieces on the agent side: sealing, time window, the DH group, the
identity file, command verification and encryption (workers/channel.py)."""

from __future__ import annotations

import json
import os
import random
import stat
import time

import pytest

from workers import channel

KEY = bytes(range(32))

pytestmark = pytest.mark.security


def _probably_prime(n: int, rounds: int = 16) -> bool:
    if n < 4:
        return n in (2, 3)
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    rng = random.Random(12)
    for _ in range(rounds):
        x = pow(rng.randrange(2, n - 2), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def test_the_dh_group_is_rfc3526_group_14_a_2048_bit_safe_prime():
    assert channel.DH_P.bit_length() == 2048
    assert _probably_prime(channel.DH_P) and _probably_prime((channel.DH_P - 1) // 2)


def test_both_sides_of_the_exchange_unwrap_the_same_key_and_a_reader_of_the_wire_cannot():
    a_private, a_public = channel.dh_keypair()
    c_private, c_public = channel.dh_keypair()
    key = os.urandom(32)
    wrapped = channel.wrap_key(key, pow(a_public, c_private, channel.DH_P), "rid")
    assert channel.wrap_key(wrapped, pow(c_public, a_private, channel.DH_P), "rid") == key
    eve_private, _ = channel.dh_keypair()  # sees both publics, has no private of either
    assert channel.wrap_key(wrapped, pow(c_public, eve_private, channel.DH_P), "rid") != key
    assert not channel.dh_public_ok(1) and not channel.dh_public_ok(channel.DH_P - 1)


def test_a_sealed_message_verifies_and_any_changed_byte_does_not():
    raw = channel.seal(KEY, {"v": 1, "n": "kp-01", "b": {"x": 1}})
    mac, data, doc = channel.unseal_unverified(raw)
    assert channel.verify(KEY, mac, data) and doc["n"] == "kp-01"
    tampered = raw.replace(b'"x":1', b'"x":2')
    assert not channel.verify(KEY, *channel.unseal_unverified(tampered)[:2])
    assert not channel.verify(bytes(32), mac, data)


@pytest.mark.parametrize(
    "raw, code",
    [
        (b"no mac at all", "malformed"),
        (b"a" * 64 + b".not json", "malformed"),
        (b"a" * 64 + b".[1, 2]", "malformed"),
        (b"a" * 64 + b'.{"v": 2}', "malformed"),
        (b"a" * (channel.MAX_MESSAGE_BYTES + 1), "too-large"),
    ],
)
def test_what_is_not_a_sealed_message_is_refused_before_anything_else(raw, code):
    with pytest.raises(channel.Refused) as exc:
        channel.unseal_unverified(raw)
    assert exc.value.code == code


def test_the_time_window():
    now = 1_000_000.0
    assert channel.check_time(now - 10, now) == now - 10
    for t, code in [
        (now + channel.MAX_FUTURE_S + 1, "future"),
        (4_070_908_800.0, "future"),  # 2099
        (now - channel.MAX_AGE_S - 1, "stale"),
        ("yesterday", "malformed"),
        (True, "malformed"),
        (float("nan"), "malformed"),
    ]:
        with pytest.raises(channel.Refused) as exc:
            channel.check_time(t, now)
        assert exc.value.code == code


def test_the_identity_file_is_written_0600_and_read_back(tmp_path):
    identity = channel.Identity(node="kp-01", kid=7, key_hex=KEY.hex(), redis_user="npc-node-kp-01")
    path = tmp_path / "state" / "identity.json"
    identity.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert channel.Identity.load(path) == identity
    assert channel.Identity.load(tmp_path / "none.json") is None
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a node identity"):
        channel.Identity.load(path)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("redis://:old@h:6379/0", "redis://npc-node-a:p%2Fw%40rd@h:6379/0"),
        (
            "rediss://npc-bootstrap:x@h:6380/0?ssl_cert_reqs=required",
            "rediss://npc-node-a:p%2Fw%40rd@h:6380/0?ssl_cert_reqs=required",
        ),
        ("redis://[::1]:6379/0", "redis://npc-node-a:p%2Fw%40rd@[::1]:6379/0"),
        (
            "redis+socket:///tmp/r.sock?password=old",
            "unix:///tmp/r.sock?username=npc-node-a&password=p%2Fw%40rd",
        ),
    ],
)
def test_the_node_logs_in_as_its_own_user(url, expected):
    assert channel.with_credentials(url, "npc-node-a", "p/w@rd") == expected


def test_command_arguments_travel_encrypted_and_verify_only_for_their_node():
    spec = {"replica_id": 3, "api_key": "k3y-of-the-engine-0123456789"}
    cmd_id, raw = channel.command(KEY, node="kp-01", kid=1, task="host.start_replica", args=[spec])
    assert b"k3y-of-the-engine" not in raw and b"replica_id" not in raw
    agent = channel.AgentChannel(None, channel.Identity("kp-01", 1, KEY.hex()))
    command = agent.verify_command(raw)
    assert (command["id"], command["k"], command["a"]) == (cmd_id, "host.start_replica", [spec])
    with pytest.raises(channel.Refused, match="replay"):
        agent.verify_command(raw)

    other = channel.AgentChannel(None, channel.Identity("kp-02", 1, KEY.hex()))
    with pytest.raises(channel.Refused, match="addressed to node 'kp-01'"):
        other.verify_command(raw)  # even with the same key, a command names its node
    stranger = channel.AgentChannel(None, channel.Identity("kp-01", 1, os.urandom(32).hex()))
    _, fresh = channel.command(KEY, node="kp-01", kid=1, task="host.ping", args=[])
    with pytest.raises(channel.Refused, match="bad signature"):
        stranger.verify_command(fresh)
    _, old = channel.command(KEY, node="kp-01", kid=1, task="host.ping", args=[])
    with pytest.raises(channel.Refused) as exc:
        agent.verify_command(old, now=time.time() + 7200)
    assert exc.value.code == "stale"


def test_an_unsigned_or_forged_command_is_refused():
    agent = channel.AgentChannel(None, channel.Identity("kp-01", 1, KEY.hex()))
    doc = {"v": 1, "n": "kp-01", "k": "host.start_replica", "id": "x", "t": time.time()}
    forged = b"0" * 64 + b"." + json.dumps(doc).encode()
    with pytest.raises(channel.Refused, match="bad signature"):
        agent.verify_command(forged)


def test_the_agent_refuses_to_send_what_the_console_would_refuse_as_too_large():
    agent = channel.AgentChannel(None, channel.Identity("kp-01", 1, KEY.hex()))
    with pytest.raises(channel.Refused) as exc:
        agent.send("console.log_lines", {"lines": ["x" * channel.MAX_MESSAGE_BYTES]})
    assert exc.value.code == "too-large"


def test_sequence_numbers_grow_across_agent_restarts_with_nothing_stored(monkeypatch):
    """Microseconds of the clock, +1 when two messages share one: a restart (seconds) always
    continues above, unless an agent sent more than a message per microsecond on average."""
    clock = [1_796_000_000 * 10**9]
    monkeypatch.setattr(channel.time, "time_ns", lambda: clock[0])
    first = channel.AgentChannel(None, channel.Identity("kp-01", 1, KEY.hex()))
    seen = [first._next_seq() for _ in range(1000)]  # a burst within one microsecond
    assert seen == sorted(set(seen))
    clock[0] += 10**9  # the agent restarts a second later
    restarted = channel.AgentChannel(None, channel.Identity("kp-01", 1, KEY.hex()))
    assert restarted._next_seq() > seen[-1]
