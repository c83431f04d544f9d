"""Promise: on Redis >= 7 with REDIS_MANAGE_ACL, a compromised host logged in as its own node
user (what enrollment gave it) can append to the inbox and read its own command list, and
nothing else: not another node's commands or answers, not the inbox, not the console's keys
or Celery queues, no MONITOR, CONFIG, KEYS, PUBLISH or SUBSCRIBE. Another node's user does not
take its password; a revoked node is cut off at once.

Against a private redis-server >= 7 (the one on PATH); skipped with the reason when there is
none, unless NPU_REQUIRE_REDIS_ACL is set. Enrollment runs the console's own code
(console/inventory/identity.py handle_enrollment), which creates the users.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError
from redis.retry import Retry

from console.accounts.services import Actor
from console.inventory.enrollment import issue_enrollment_token
from console.inventory.identity import handle_enrollment, revoke_credential
from console.inventory.inbox import Consumer
from tests.kit import free_port
from workers import channel
from workers.contracts import CONSOLE_QUEUE, JOBS_QUEUE

pytestmark = [pytest.mark.security, pytest.mark.django_db]
CONSOLE_PASSWORD = "console-" + secrets.token_hex(8)
BOOTSTRAP_PASSWORD = "bootstrap-" + secrets.token_hex(8)


def _unavailable(reason: str):
    if os.environ.get("NPU_REQUIRE_REDIS_ACL"):
        pytest.fail(f"{reason}, and NPU_REQUIRE_REDIS_ACL is set")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def redis7_port():
    binary = shutil.which("redis-server")
    if binary is None:
        _unavailable("redis-server is not on PATH (per-node ACLs need a real Redis >= 7)")
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    found = re.search(r"v=(\d+)\.(\d+)", out.stdout)
    version = (int(found[1]), int(found[2])) if found else (0, 0)
    if version < (7, 0):
        _unavailable(f"redis-server on PATH is {version[0]}.{version[1]}; ACLs need >= 7.0")
    workdir = Path(tempfile.mkdtemp(prefix="npc-acl-attack-"))
    proc = None
    try:
        for _ in range(5):  # a port taken between choosing and binding it: try another
            port = free_port()
            argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
            argv += ["--save", "", "--appendonly", "no", "--requirepass", CONSOLE_PASSWORD]
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            client = redis.Redis(port=port, password=CONSOLE_PASSWORD, socket_timeout=2)
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    client.ping()
                    break
                except RedisError:
                    time.sleep(0.05)
            client.close()
            if proc.poll() is None:
                break
        else:
            raise AssertionError("redis-server did not start")
        yield port
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def acl_redis(redis7_port, settings):
    """The console on the private Redis, managing ACLs; a clean Redis per test."""
    settings.REDIS_MANAGE_ACL = True
    settings.NPU_BOOTSTRAP_REDIS_PASSWORD = BOOTSTRAP_PASSWORD
    settings.REDIS_URL = f"redis://:{CONSOLE_PASSWORD}@127.0.0.1:{redis7_port}/0"
    r = redis.Redis(port=redis7_port, password=CONSOLE_PASSWORD, socket_timeout=5)
    r.flushall()
    for user in r.acl_users():
        if (user.decode() if isinstance(user, bytes) else user) != "default":
            r.execute_command("ACL", "DELUSER", user)
    from console.inventory import redis_acl

    redis_acl.ensure_bootstrap_user(r, BOOTSTRAP_PASSWORD)
    yield r
    r.close()


def login(port: int, user: str, password: str) -> redis.Redis:
    return redis.Redis(
        port=port, username=user, password=password, socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )


def enroll(name: str) -> channel.Identity:
    """Enroll `name` through the console's enrollment code, answered on Redis as for an agent."""
    _, raw = issue_enrollment_token(actor=Actor.system("tests"), name=f"for {name}")
    private, public = channel.dh_keypair()
    rid = secrets.token_hex(32)
    doc = {"v": 1, "n": name, "hint": raw[:10], "rid": rid, "dh": format(public, "x")}
    doc |= {"t": time.time(), "agent_version": "0.2.0"}
    assert handle_enrollment(channel.seal(channel.token_mac_key(raw), doc)) == "issued"
    from console.hot import get_redis

    _, _, answer = channel.unseal_unverified(get_redis().lpop(channel.enroll_reply_key(rid)))
    shared = pow(int(answer["dh"], 16), private, channel.DH_P)
    key = channel.wrap_key(bytes.fromhex(answer["wrapped"]), shared, rid)
    assert answer["redis_user"] == channel.node_user(name)
    return channel.Identity(name, answer["kid"], key.hex(), answer["redis_user"])


def denied(call) -> None:
    with pytest.raises(NoPermissionError):
        call()


def test_a_node_user_reaches_nothing_but_its_own_lists(acl_redis, redis7_port):
    suffix = secrets.token_hex(2)
    a, b = enroll(f"acl-a-{suffix}"), enroll(f"acl-b-{suffix}")
    acl_redis.rpush(channel.cmd_key(a.node), b"a command for A")
    acl_redis.rpush(channel.INBOX_KEY, b"a message of A")
    acl_redis.hset("npc:inbox:seq", a.node, 1)
    host_b = login(redis7_port, b.redis_user, channel.redis_password(b.key))

    # what B may do: ping, push to the inbox (still MAC-checked), read its own commands
    assert host_b.ping()
    assert host_b.rpush(channel.INBOX_KEY, b"B's own message") == 2
    assert host_b.llen(channel.cmd_key(b.node)) == 0

    a_cmds, a_reply = channel.cmd_key(a.node), channel.reply_key(a.node, "c0ffee")
    denied(lambda: host_b.lrange(a_cmds, 0, -1))  # A's commands
    denied(lambda: host_b.lpop(a_cmds))
    denied(lambda: host_b.blpop([a_cmds], timeout=0.1))
    denied(lambda: host_b.llen(a_cmds))
    denied(lambda: host_b.rpush(a_cmds, b"forged"))
    denied(lambda: host_b.rpush(a_reply, b"forged answer"))  # A's answers
    denied(lambda: host_b.lrange(channel.INBOX_KEY, 0, -1))  # other nodes' messages
    denied(lambda: host_b.lpop(channel.INBOX_KEY))
    denied(lambda: host_b.delete(channel.INBOX_KEY))
    denied(lambda: host_b.lpush(channel.INBOX_KEY, b"jump the queue"))
    denied(lambda: host_b.hset("npc:inbox:seq", a.node, 2**62))  # lock A out as a "replay"
    denied(lambda: host_b.set("npc:inbox:leader", "me", px=600_000))  # stall the consumer
    denied(lambda: host_b.hgetall("npc:refusals"))
    denied(lambda: host_b.lpush(CONSOLE_QUEUE, b"{}"))  # the console's Celery queues
    denied(lambda: host_b.lpush(JOBS_QUEUE, b"{}"))
    denied(lambda: host_b.rpush(channel.ENROLL_KEY, b"enroll me"))
    denied(lambda: host_b.get("npc:cred:version"))
    denied(lambda: host_b.keys("*"))
    denied(lambda: host_b.scan(0))
    denied(lambda: host_b.config_get("*"))
    denied(lambda: host_b.config_set("requirepass", ""))
    denied(lambda: host_b.publish("celery.pidbox", b"shutdown"))
    denied(lambda: host_b.execute_command("SUBSCRIBE", "celery.pidbox"))
    denied(lambda: host_b.execute_command("PSUBSCRIBE", "*"))
    denied(lambda: host_b.execute_command("MONITOR"))
    denied(lambda: host_b.acl_list())
    denied(lambda: host_b.client_list())
    denied(lambda: host_b.eval("return redis.call('LRANGE', KEYS[1], 0, -1)", 1, a_cmds))
    denied(lambda: host_b.flushall())
    with pytest.raises(AuthenticationError):  # A's user does not take B's password
        login(redis7_port, a.redis_user, channel.redis_password(b.key)).ping()

    assert acl_redis.lrange(a_cmds, 0, -1) == [b"a command for A"]
    assert acl_redis.hget("npc:inbox:seq", a.node) == b"1"
    host_b.close()


def test_the_bootstrap_user_can_only_ask_to_enroll(acl_redis, redis7_port):
    a = enroll(f"acl-a-{secrets.token_hex(2)}")
    acl_redis.rpush(channel.cmd_key(a.node), b"a command for A")
    boot = login(redis7_port, channel.BOOTSTRAP_USER, BOOTSTRAP_PASSWORD)
    assert boot.rpush(channel.ENROLL_KEY, b"request") == 1
    denied(lambda: boot.lrange(channel.ENROLL_KEY, 0, -1))  # others' requests
    denied(lambda: boot.lrange(channel.cmd_key(a.node), 0, -1))
    denied(lambda: boot.rpush(channel.INBOX_KEY, b"x"))
    denied(lambda: boot.execute_command("MONITOR"))
    denied(lambda: boot.keys("*"))
    boot.close()


def test_a_revoked_node_is_cut_off_at_once(
    acl_redis, redis7_port, admin_user, django_capture_on_commit_callbacks
):
    """Revocation bumps the credential version; the inbox consumer's next step (within a
    second) deletes the node's user and cuts its open connection."""
    b = enroll(f"acl-b-{secrets.token_hex(2)}")
    host_b = login(redis7_port, b.redis_user, channel.redis_password(b.key))
    assert host_b.ping()
    with django_capture_on_commit_callbacks(execute=True):
        revoke_credential(actor=Actor(user=admin_user, name="ada"), name=b.node)
    Consumer().sync_acl()
    with pytest.raises((redis.ConnectionError, AuthenticationError, ResponseError)):
        host_b.rpush(channel.INBOX_KEY, b"still here?")
    with pytest.raises(AuthenticationError):
        login(redis7_port, b.redis_user, channel.redis_password(b.key)).ping()
    assert acl_redis.llen(channel.INBOX_KEY) == 0
