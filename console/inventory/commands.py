"""Console -> agent commands on the signed channel (workers/channel.py).

Each command is signed with the key of the node it is for, so an agent runs only what the
console signed for it; an answer comes back signed by that node on its own reply key.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from django.db import transaction

from console.hot import get_redis
from console.inventory.identity import node_key
from console.inventory.models import NodeCredential
from workers import channel

log = logging.getLogger(__name__)
COMMAND_TTL_S = 3600  # a command queue of a node that never comes back does not grow forever


class NoAnswer(Exception):
    """The agent did not answer in time (offline, busy, or no credential to sign with)."""


def _current_kid(node: str) -> int | None:
    return (
        NodeCredential.objects.filter(node__name=node, revoked_at__isnull=True)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )


def send_command(
    node: str, task: str, args: list[Any], *, reply: bool = False, kid: int | None = None
) -> str | None:
    """Sign and queue one command for `node`; returns its id (None: the node has no active
    credential, so no agent could verify it: nothing is sent)."""
    kid = kid if kid is not None else _current_kid(node)
    if kid is None:
        log.warning("command %s for %s not sent: the node has no active credential", task, node)
        return None
    cmd_id, raw = channel.command(
        node_key(node, kid), node=node, kid=kid, task=task, args=args, reply=reply
    )
    pipe = get_redis().pipeline(transaction=False)
    pipe.rpush(channel.cmd_key(node), raw)
    pipe.expire(channel.cmd_key(node), COMMAND_TTL_S)
    pipe.execute()
    return cmd_id


def send_on_commit(node: str, task: str, args: list[Any]) -> None:
    """Send a command once the current transaction commits (ids and generations, never
    instances: the agent checks whether the work is still needed)."""
    transaction.on_commit(lambda: send_command(node, task, args))


def call(node: str, task: str, args: list[Any], *, timeout: float) -> Any:
    """Send a command and wait for the node's signed answer. Raises NoAnswer."""
    return timed_call(node, task, args, timeout=timeout).body


class TimedAnswer(NamedTuple):
    """An answer and the clocks around it, Unix seconds: `sent_at` and `read_at` the
    console's (just before the command was queued, just after the answer was read),
    `replied_at` the agent's (the signed reply's own time)."""

    body: Any
    sent_at: float
    read_at: float
    replied_at: float


def timed_call(
    node: str, task: str, args: list[Any], *, timeout: float, kid: int | None = None
) -> TimedAnswer:
    """call(), with the times of an NTP-style exchange (checks.clock_offset): the answer
    comes on its own reply key, which this call is blocked on, so no queue of other messages
    sits between the agent's answer and `read_at`. Raises NoAnswer."""
    kid = kid if kid is not None else _current_kid(node)
    sent_at = time.time()
    cmd_id = send_command(node, task, args, reply=True, kid=kid) if kid is not None else None
    if cmd_id is None:
        raise NoAnswer(f"node {node} has no active credential")
    deadline = time.monotonic() + timeout
    r = get_redis()
    while (left := deadline - time.monotonic()) > 0:
        got = r.blpop([channel.reply_key(node, cmd_id)], timeout=max(0.01, min(left, 4.0)))
        if got is None:
            continue
        read_at = time.time()
        try:
            doc = _verified_answer(node, cmd_id, got[1])
            return TimedAnswer(doc.get("b"), sent_at, read_at, float(doc.get("t") or 0))
        except channel.Refused as exc:  # someone else wrote on the key: keep waiting
            log.warning("answer to %s from %s refused: %s", task, node, exc)
    raise NoAnswer(f"the agent on {node} did not answer within {timeout:g}s")


def _verified_answer(node: str, cmd_id: str, raw: bytes) -> dict:
    mac, data, doc = channel.unseal_unverified(raw)
    kid = doc.get("kid")
    active = NodeCredential.objects.filter(node__name=node, pk=kid, revoked_at__isnull=True)
    if not isinstance(kid, int) or not active.exists():
        raise channel.Refused("answer signed with no active credential of the node", "identity")
    if not channel.verify(node_key(node, kid), mac, data):
        raise channel.Refused("bad signature", "signature")
    if doc.get("id") != cmd_id or doc.get("n") != node:
        raise channel.Refused("answer to another command", "malformed")
    return doc
