"""Per-node Redis ACL users, proved against a real redis-server >= 7 with redis-py clients
logged in as the users the console creates (console/inventory/redis_acl.py)."""

from __future__ import annotations

import logging
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
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisError
from redis.retry import Retry

from console.inventory import redis_acl
from tests.kit import free_port

pytestmark = pytest.mark.security

CONSOLE_PASSWORD = "console-" + secrets.token_hex(8)
BOOTSTRAP_PASSWORD = "bootstrap-" + secrets.token_hex(8)


def _redis_server_version(binary: str) -> tuple[int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    match = re.search(r"v=(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _unavailable(reason: str):
    if os.environ.get("NPU_REQUIRE_REDIS_ACL"):
        pytest.fail(f"{reason}, and NPU_REQUIRE_REDIS_ACL is set")
    pytest.skip(reason)


def _start(binary: str, workdir: Path) -> tuple[subprocess.Popen, int]:
    """redis-server on a free loopback port with the console's password. A port taken between
    choosing and binding it makes the server exit: then another port is tried."""
    for _ in range(5):
        port = free_port()
        log = open(workdir / f"redis-{port}.log", "wb")  # noqa: SIM115 - closed below
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
        argv += ["--save", "", "--appendonly", "no", "--requirepass", CONSOLE_PASSWORD]
        argv += ["--enable-debug-command", "yes"]  # so that only the ACL refuses DEBUG
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        client = redis.Redis(port=port, password=CONSOLE_PASSWORD, socket_timeout=2)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                client.ping()
                client.close()
                return proc, port
            except RedisError:
                time.sleep(0.05)
        _stop(proc)
    raise AssertionError(f"redis-server did not start; see {workdir}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def redis7_port():
    """A private redis-server >= 7 (the one on PATH), stopped at the end of the module."""
    binary = shutil.which("redis-server")
    if binary is None:
        _unavailable("redis-server is not on PATH (ACL selectors need a real Redis >= 7)")
    version = _redis_server_version(binary)
    if version < (7, 0):
        _unavailable(f"redis-server on PATH is {version[0]}.{version[1]}; ACLs need >= 7.0")
    workdir = Path(tempfile.mkdtemp(prefix="npc-acl-"))
    proc, port = _start(binary, workdir)
    try:
        yield port
    finally:
        _stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def console(redis7_port, settings):
    """The console's client (full rights), with ACL management on; a clean Redis per test."""
    settings.REDIS_MANAGE_ACL = True
    r = redis.Redis(port=redis7_port, password=CONSOLE_PASSWORD, socket_timeout=5)
    r.flushall()
    for user in users(r) - {"default"}:
        r.execute_command("ACL", "DELUSER", user)
    yield r
    r.close()


def users(r: redis.Redis) -> set[str]:
    return {u.decode() if isinstance(u, bytes) else u for u in r.acl_users()}


def login(port: int, user: str, password: str, **kw) -> redis.Redis:
    """A client logged in as `user`; no retries, so a cut connection fails the next command."""
    kw.setdefault("retry", Retry(NoBackoff(), 0))
    return redis.Redis(port=port, username=user, password=password, socket_timeout=5, **kw)


@pytest.fixture
def node(console, redis7_port):
    """Node n1 and node n2 enrolled; a client logged in as n1."""
    assert redis_acl.ensure_node_user(console, "n1", "pw-n1")
    assert redis_acl.ensure_node_user(console, "n2", "pw-n2")
    client = login(redis7_port, "npc-node-n1", "pw-n1")
    yield client
    client.close()


def refused(call) -> None:
    with pytest.raises(NoPermissionError):
        call()


# --- rules -----------------------------------------------------------------------------------


def test_user_names_and_rules():
    assert redis_acl.node_user("ascend-01") == "npc-node-ascend-01"
    rules = redis_acl.node_acl_rules("n1")
    assert "-@all" in rules and "resetchannels" in rules
    assert "(+rpush %W~npc:inbox)" in rules and "%RW~npc:cmd:n1" in rules
    assert "(+rpush +expire %RW~npc:reply:n1:*)" in rules
    assert "(+rpush %W~npc:enroll)" in redis_acl.bootstrap_acl_rules()


@pytest.mark.parametrize("name", ["", "N1", "n1*", "n?", "n[1]", "a b", "n1:x", "x" * 64, None])
def test_a_name_that_could_widen_a_key_pattern_is_refused(name):
    with pytest.raises(ValueError):
        redis_acl.node_user(name)
    with pytest.raises(ValueError):
        redis_acl.node_acl_rules(name)


def test_an_empty_password_is_refused(console):
    with pytest.raises(ValueError):
        redis_acl.ensure_node_user(console, "n1", "")
    with pytest.raises(ValueError):
        redis_acl.ensure_bootstrap_user(console, "")
    assert console.acl_getuser("npc-node-n1") is None


# --- what a node may do ----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_connects_as_the_node_user(console, redis7_port, protocol):
    """redis-py's handshake (HELLO/AUTH; CLIENT SETINFO is refused and ignored) works."""
    redis_acl.ensure_node_user(console, "n1", "pw-n1")
    client = login(redis7_port, "npc-node-n1", "pw-n1", protocol=protocol)
    assert client.ping() is True
    assert client.rpush("npc:inbox", "m") == 1
    client.close()


def test_node_appends_to_the_inbox_but_cannot_read_or_remove_it(console, node):
    assert node.rpush("npc:inbox", "signed-message") == 1
    refused(lambda: node.lpop("npc:inbox"))
    refused(lambda: node.blpop(["npc:inbox"], timeout=1))
    refused(lambda: node.lrange("npc:inbox", 0, -1))
    refused(lambda: node.llen("npc:inbox"))
    refused(lambda: node.delete("npc:inbox"))
    refused(lambda: node.expire("npc:inbox", 1))
    refused(lambda: node.ltrim("npc:inbox", 1, 0))
    refused(lambda: node.lpush("npc:inbox", "x"))
    assert console.lrange("npc:inbox", 0, -1) == [b"signed-message"]


def test_node_reads_only_its_own_command_list(console, node):
    console.rpush("npc:cmd:n1", "c1", "c2")
    console.rpush("npc:cmd:n2", "other")
    assert node.llen("npc:cmd:n1") == 2
    assert node.blpop(["npc:cmd:n1"], timeout=1) == (b"npc:cmd:n1", b"c1")
    assert node.lpop("npc:cmd:n1") == b"c2"
    refused(lambda: node.rpush("npc:cmd:n1", "self-command"))
    refused(lambda: node.blpop(["npc:cmd:n2"], timeout=1))
    refused(lambda: node.blpop(["npc:cmd:n1", "npc:cmd:n2"], timeout=1))
    refused(lambda: node.lpop("npc:cmd:n2"))
    refused(lambda: node.llen("npc:cmd:n2"))
    refused(lambda: node.rpush("npc:cmd:n2", "forged"))
    assert console.lrange("npc:cmd:n2", 0, -1) == [b"other"]


def test_node_answers_only_under_its_own_reply_prefix(console, node):
    assert node.rpush("npc:reply:n1:abc", "answer") == 1
    assert node.expire("npc:reply:n1:abc", 60) is True
    assert 0 < console.ttl("npc:reply:n1:abc") <= 60
    refused(lambda: node.lpop("npc:reply:n1:abc"))
    refused(lambda: node.rpush("npc:reply:n2:abc", "forged"))
    refused(lambda: node.expire("npc:reply:n2:abc", 60))
    refused(lambda: node.rpush("npc:reply:n1", "no-prefix"))
    refused(lambda: node.rpush("npc:reply:n10:abc", "prefix-of-another-node"))


FORBIDDEN = {
    "MONITOR": ["MONITOR"],
    "KEYS": ["KEYS", "*"],
    "SCAN": ["SCAN", "0"],
    "CONFIG GET": ["CONFIG", "GET", "*"],
    "ACL LIST": ["ACL", "LIST"],
    "ACL WHOAMI": ["ACL", "WHOAMI"],
    "FLUSHALL": ["FLUSHALL"],
    "FLUSHDB": ["FLUSHDB"],
    "SUBSCRIBE": ["SUBSCRIBE", "console.pidbox"],
    "PSUBSCRIBE": ["PSUBSCRIBE", "*"],
    "PUBLISH": ["PUBLISH", "celeryev", "x"],
    "EVAL": ["EVAL", "return redis.call('KEYS', '*')", "0"],
    "SCRIPT LOAD": ["SCRIPT", "LOAD", "return 1"],
    "CLIENT LIST": ["CLIENT", "LIST"],
    "CLIENT KILL": ["CLIENT", "KILL", "USER", "default"],
    "DEBUG": ["DEBUG", "SLEEP", "0"],
    "INFO": ["INFO"],
    "GET node state": ["GET", "npc:node:x"],
    "HGETALL node state": ["HGETALL", "npc:node:x"],
    "LRANGE celery queue": ["LRANGE", "console", "0", "-1"],
    "HGETALL unacked": ["HGETALL", "unacked"],
    "GET task meta": ["GET", "celery-task-meta-x"],
    "SMEMBERS kombu bindings": ["SMEMBERS", "_kombu.binding.console"],
    "SHUTDOWN": ["SHUTDOWN", "NOSAVE"],
}


@pytest.mark.parametrize("argv", FORBIDDEN.values(), ids=FORBIDDEN.keys())
def test_node_cannot_run_anything_else(console, node, argv):
    console.hset("npc:node:x", "k", "v")
    console.rpush("console", "task")
    refused(lambda: node.execute_command(*argv))
    assert console.ping()  # still up (SHUTDOWN, DEBUG were refused)


# --- bootstrap -------------------------------------------------------------------------------


def test_bootstrap_user_enrolls_and_reads_a_reply_only(console, redis7_port):
    assert redis_acl.ensure_bootstrap_user(console, BOOTSTRAP_PASSWORD)
    boot = login(redis7_port, "npc-bootstrap", BOOTSTRAP_PASSWORD)
    reply = "npc:enroll:reply:" + secrets.token_hex(32)
    assert boot.rpush("npc:enroll", "request") == 1
    console.rpush(reply, "wrapped-answer", "second")
    assert boot.lpop(reply) == b"wrapped-answer"
    assert boot.blpop([reply], timeout=1) == (reply.encode(), b"second")
    refused(lambda: boot.lpop("npc:enroll"))
    refused(lambda: boot.lrange("npc:enroll", 0, -1))
    refused(lambda: boot.llen("npc:enroll"))
    refused(lambda: boot.rpush(reply, "forged-answer"))
    refused(lambda: boot.rpush("npc:inbox", "x"))
    refused(lambda: boot.lpop("npc:inbox"))
    refused(lambda: boot.blpop(["npc:cmd:n1"], timeout=1))
    refused(lambda: boot.execute_command("KEYS", "npc:enroll:reply:*"))
    refused(lambda: boot.execute_command("SCAN", "0"))
    assert console.lrange("npc:enroll", 0, -1) == [b"request"]
    boot.close()


# --- lifecycle -------------------------------------------------------------------------------


def _users_connected(console) -> set[str]:
    return {c.get("user") for c in console.client_list()}


def test_remove_node_user_cuts_an_open_connection(console, node, redis7_port):
    assert node.ping()
    assert "npc-node-n1" in _users_connected(console)
    assert redis_acl.remove_node_user(console, "n1")
    assert console.acl_getuser("npc-node-n1") is None
    assert "npc-node-n1" not in _users_connected(console)
    with pytest.raises((RedisConnectionError, NoPermissionError)):  # AuthenticationError too
        node.rpush("npc:inbox", "after revocation")
    assert console.llen("npc:inbox") == 0
    assert redis_acl.remove_node_user(console, "n1")  # idempotent


def test_a_new_password_cuts_connections_made_with_the_old_one(console, node, redis7_port):
    assert node.ping()
    redis_acl.ensure_node_user(console, "n1", "pw-n1-rotated")
    with pytest.raises(RedisConnectionError):
        node.rpush("npc:inbox", "old password")
    fresh = login(redis7_port, "npc-node-n1", "pw-n1-rotated")
    assert fresh.rpush("npc:inbox", "new password") == 1
    fresh.close()


def test_ensure_is_idempotent_and_drops_a_stale_rule(console, node):
    before = console.acl_getuser("npc-node-n1")
    assert node.ping()
    console.execute_command("ACL", "SETUSER", "npc-node-n1", "+get", "~*", "&*")
    assert node.get("npc:node:x") is None  # the stale rule works until the next ensure
    redis_acl.ensure_node_user(console, "n1", "pw-n1")
    redis_acl.ensure_node_user(console, "n1", "pw-n1")
    assert console.acl_getuser("npc-node-n1") == before
    assert node.rpush("npc:inbox", "same connection") == 1  # same password: not cut
    refused(lambda: node.get("npc:node:x"))


def test_sync_creates_the_wanted_users_and_deletes_stale_ones(console, redis7_port):
    redis_acl.ensure_node_user(console, "stale", "pw-stale")
    console.execute_command("ACL", "SETUSER", "someone-else", "on", ">x", "+ping")
    stale = login(redis7_port, "npc-node-stale", "pw-stale")
    assert stale.ping()
    result = redis_acl.sync_node_users(console, {"n1": "pw-n1", "n2": "pw-n2"})
    assert result == redis_acl.SyncResult(
        ensured=["npc-node-n1", "npc-node-n2"], removed=["npc-node-stale"]
    )
    assert users(console) == {"default", "someone-else", "npc-node-n1", "npc-node-n2"}
    with pytest.raises((RedisConnectionError, NoPermissionError)):
        stale.rpush("npc:inbox", "x")
    assert login(redis7_port, "npc-node-n2", "pw-n2").rpush("npc:inbox", "x") == 1
    again = redis_acl.sync_node_users(console, {"n1": "pw-n1", "n2": "pw-n2"})
    assert again.removed == []


def test_sync_after_a_redis_restart_restores_the_users(console, redis7_port):
    """Redis without an aclfile forgets users: simulated by deleting them all."""
    redis_acl.sync_node_users(console, {"n1": "pw-n1"})
    console.execute_command("ACL", "DELUSER", "npc-node-n1")
    redis_acl.sync_node_users(console, {"n1": "pw-n1"})
    assert login(redis7_port, "npc-node-n1", "pw-n1").rpush("npc:inbox", "back") == 1


# --- when the console does not manage ACLs ---------------------------------------------------


def test_nothing_happens_when_the_setting_is_off(console, settings):
    settings.REDIS_MANAGE_ACL = False
    assert redis_acl.ensure_node_user(console, "n1", "pw-n1") is False
    assert redis_acl.ensure_bootstrap_user(console, "pw") is False
    assert redis_acl.sync_node_users(console, {"n1": "pw"}) is None
    assert redis_acl.remove_node_user(console, "n1") is False
    assert users(console) == {"default"}


class OldRedis:
    """A Redis 6.2 as far as INFO says; any other command fails the test."""

    def info(self, section=None):
        return {"redis_version": "6.2.14"}

    def __getattr__(self, name):
        raise AssertionError(f"{name} called on a Redis without ACL selectors")


def test_redis_6_gets_one_warning_and_no_change(settings, caplog, monkeypatch):
    settings.REDIS_MANAGE_ACL = True
    monkeypatch.setattr(redis_acl, "_warned_unsupported", False)
    old = OldRedis()
    assert redis_acl.acl_supported(old) is False
    with caplog.at_level(logging.WARNING, logger=redis_acl.__name__):
        assert redis_acl.ensure_node_user(old, "n1", "pw") is False
        assert redis_acl.ensure_bootstrap_user(old, "pw") is False
        assert redis_acl.sync_node_users(old, {"n1": "pw"}) is None
        assert redis_acl.remove_node_user(old, "n1") is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "older than 7.0" in warnings[0].getMessage()
    assert "HMAC" in warnings[0].getMessage()


def test_acl_supported_reads_the_server_version(console):
    assert redis_acl.acl_supported(console) is True


# --- settings --------------------------------------------------------------------------------


def test_managing_acls_without_a_bootstrap_password_stops_start_up(tmp_path):
    from tests.console.test_settings import run_check

    result = run_check(
        REDIS_MANAGE_ACL="1", NPU_BOOTSTRAP_REDIS_PASSWORD="", NPU_CONSOLE_VAR_DIR=str(tmp_path)
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "configuration error: NPU_BOOTSTRAP_REDIS_PASSWORD: required when REDIS_MANAGE_ACL is on "
        "(the password of the npc-bootstrap Redis user)"
    )
    secret = tmp_path / "bootstrap"
    secret.write_text("from-a-file\n")
    ok = run_check(
        REDIS_MANAGE_ACL="1",
        NPU_BOOTSTRAP_REDIS_PASSWORD_FILE=str(secret),
        NPU_CONSOLE_VAR_DIR=str(tmp_path),
    )
    assert ok.returncode == 0, ok.stderr
