"""Redis ACL users of the host agents: least privilege on the broker (Redis >= 7.0).

Each enrolled host's agent logs in as `npc-node-<node>` and may only append to the console's
inbox, read its own command list and answer under its own reply prefix. Before enrollment an
agent logs in as `npc-bootstrap`, which may only append enrollment requests and pop a reply.
The console itself keeps full rights (the default user, or its own user).

Every writing function here is a no-op returning False/None unless `REDIS_MANAGE_ACL` is on
and Redis is >= 7.0 (ACL selectors and the %R/%W key permissions are 7.0 features); on an
older Redis one warning is logged per process and nothing is changed — message HMACs still
authenticate every message. Users live in Redis's memory: without an aclfile they are gone
after a Redis restart, so the console re-creates them with `sync_node_users` at start and
periodically.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any, NamedTuple

from django.conf import settings
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

from workers.channel import BOOTSTRAP_USER, ENROLL_KEY, INBOX_KEY  # noqa: E402 - one home

INBOX = INBOX_KEY
ENROLL = ENROLL_KEY
ENROLL_REPLY_PREFIX = "npc:enroll:reply:"
NODE_USER_PREFIX = "npc-node-"
_NODE = re.compile(r"[a-z0-9-]{1,63}")

_warned_unsupported = False


class SyncResult(NamedTuple):
    ensured: list[str]
    removed: list[str]


def cmd_key(node: str) -> str:
    """The command list the node's agent reads."""
    return f"npc:cmd:{_checked(node)}"


def reply_prefix(node: str) -> str:
    """The prefix of the keys the node's agent answers commands under."""
    return f"npc:reply:{_checked(node)}:"


def node_user(node: str) -> str:
    """The Redis user of a node's agent. Raises ValueError unless `node` is a DNS label
    ([a-z0-9-]{1,63}): the name goes into key patterns, where `*`, `?` or `[` would widen them."""
    return NODE_USER_PREFIX + _checked(node)


def node_acl_rules(node: str) -> list[str]:
    """The node user's permissions (without `reset`, `on` and the password): PING; BLPOP, LPOP
    and LLEN on its own command list; RPUSH (only) to the inbox; RPUSH and EXPIRE under its own
    reply prefix. No pub/sub channel, no other command, no other key."""
    return [
        "resetchannels",
        "-@all",
        "+ping",
        f"%RW~{cmd_key(node)}",
        "+blpop",
        "+lpop",
        "+llen",
        f"(+rpush %W~{INBOX})",
        f"(+rpush +expire %RW~{reply_prefix(node)}*)",
    ]


def bootstrap_acl_rules() -> list[str]:
    """The bootstrap user's permissions: PING; RPUSH (only) to the enrollment list; BLPOP and
    LPOP on enrollment replies (their ids are random 32-byte hex and their payload is wrapped,
    so popping another agent's reply gains nothing)."""
    return [
        "resetchannels",
        "-@all",
        "+ping",
        "+blpop",
        "+lpop",
        f"%RW~{ENROLL_REPLY_PREFIX}*",
        f"(+rpush %W~{ENROLL})",
    ]


def acl_supported(r: Any) -> bool:
    """Whether the Redis behind client `r` is >= 7.0 (INFO server's redis_version)."""
    version = str(r.info("server").get("redis_version", "0"))
    parts = re.findall(r"\d+", version)[:2] + ["0", "0"]
    return (int(parts[0]), int(parts[1])) >= (7, 0)


def ensure_node_user(r: Any, node: str, password: str, *more: str) -> bool:
    """Create or replace the node's user: `reset` first, so no rule of an earlier version
    survives. Idempotent. Several passwords while a credential rotation is in flight (old and
    new). When a password is dropped, the user's open connections are cut (some authenticated
    with it; the agent reconnects). False when not managed (setting off, Redis < 7)."""
    user = node_user(node)
    passwords = [password, *more]
    for p in passwords:
        _check_password(p)
    if not _managed(r):
        return False
    _ensure_node_user(r, user, node, passwords)
    return True


def remove_node_user(r: Any, node: str) -> bool:
    """Delete the node's user and cut every connection logged in as it: the next command of a
    revoked agent fails. Idempotent. False when not managed."""
    if not _managed(r):
        return False
    user = node_user(node)
    r.execute_command("ACL", "DELUSER", user)  # Redis 7 also disconnects the user's clients
    _kill_clients(r, user)  # belt and braces: nothing must stay connected as a revoked node
    return True


def ensure_bootstrap_user(r: Any, password: str) -> bool:
    """Create or replace `npc-bootstrap` (reset first). Idempotent. False when not managed."""
    _check_password(password)
    if not _managed(r):
        return False
    _set_user(r, BOOTSTRAP_USER, password, bootstrap_acl_rules())
    return True


def sync_node_users(r: Any, wanted: dict[str, str | list[str]]) -> SyncResult | None:
    """Make Redis's `npc-node-*` users exactly `wanted` (node -> password or passwords): ensure
    each wanted one, delete (and disconnect) every other. For console start and a periodic job,
    since Redis without an aclfile forgets users on restart. None when not managed."""
    wanted = {n: [p] if isinstance(p, str) else list(p) for n, p in wanted.items()}
    for node, passwords in wanted.items():
        node_user(node)  # refuse a bad name before changing anything
        if not passwords:
            raise ValueError(f"node {node}: no password")
        for p in passwords:
            _check_password(p)
    if not _managed(r):
        return None
    keep = {node_user(node) for node in wanted}
    removed = []
    for user in map(_s, r.acl_users()):
        if user.startswith(NODE_USER_PREFIX) and user not in keep:
            r.execute_command("ACL", "DELUSER", user)
            _kill_clients(r, user)
            removed.append(user)
    _ensure_node_users(r, [(node_user(node), node, pw) for node, pw in wanted.items()])
    if removed:
        log.info("removed Redis users of nodes no longer enrolled: %s", ", ".join(removed))
    return SyncResult(ensured=sorted(keep), removed=sorted(removed))


# --- helpers ---------------------------------------------------------------------------------


def _managed(r: Any) -> bool:
    global _warned_unsupported
    if not getattr(settings, "REDIS_MANAGE_ACL", False):
        return False
    if acl_supported(r):
        return True
    if not _warned_unsupported:
        _warned_unsupported = True
        log.warning(
            "REDIS_MANAGE_ACL is on but Redis %s is older than 7.0 (no ACL selectors): the "
            "console creates no per-node Redis users and every agent keeps the rights of the "
            "password it has. Message HMACs still authenticate every message. Upgrade Redis to "
            "7 to confine each agent to its own keys.",
            r.info("server").get("redis_version", "?"),
        )
    return False


def _ensure_node_user(r: Any, user: str, node: str, passwords: list[str]) -> None:
    _ensure_node_users(r, [(user, node, passwords)])


SYNC_CHUNK = 500


def _ensure_node_users(r: Any, users: list[tuple[str, str, list[str]]]) -> None:
    """Set each (user, node, passwords); cut the clients of a user whose password was dropped.
    Pipelined, SYNC_CHUNK users a round trip: a 10,000-node fleet's periodic sync is 40 round
    trips, not 20,000 (which stalled the inbox consumer ~2.5 s a minute)."""
    for start in range(0, len(users), SYNC_CHUNK):
        chunk = users[start : start + SYNC_CHUNK]
        pipe = r.pipeline(transaction=False)
        for user, _, _ in chunk:
            pipe.acl_getuser(user)
        olds = pipe.execute()
        pipe = r.pipeline(transaction=False)
        for user, node, passwords in chunk:
            _set_user(pipe, user, passwords, node_acl_rules(node))
        pipe.execute()
        for (user, _, passwords), old in zip(chunk, olds, strict=True):
            if old and not set(map(_s, old.get("passwords") or [])) <= set(map(_hash, passwords)):
                _kill_clients(r, user)


def _set_user(r: Any, user: str, passwords: str | list[str], rules: list[str]) -> None:
    passwords = [passwords] if isinstance(passwords, str) else passwords
    secrets_ = [f">{p}" for p in passwords]
    r.execute_command("ACL", "SETUSER", user, "reset", "on", *secrets_, *rules)


def _kill_clients(r: Any, user: str) -> None:
    try:
        r.execute_command("CLIENT", "KILL", "USER", user)
    except ResponseError as exc:
        if "no such user" not in str(exc).lower():  # deleted: Redis already cut its clients
            raise


def _checked(node: str) -> str:
    if not isinstance(node, str) or not _NODE.fullmatch(node):
        raise ValueError(f"not a node name (DNS label [a-z0-9-]{{1,63}}): {node!r}")
    return node


def _check_password(password: str) -> None:
    if not isinstance(password, str) or not password:
        raise ValueError("a Redis user needs a non-empty password")


def _hash(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def _s(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
