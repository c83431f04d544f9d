"""Nodes with a real identity for tests and benches: enroll in-process, seal messages as the
agent does (workers/channel.py), hand them to the console's inbox."""

from __future__ import annotations

import time
from collections import Counter
from itertools import count

from console.accounts.services import Actor
from console.inventory.enrollment import issue_enrollment_token
from console.inventory.identity import _issue, node_key
from workers import channel

_seq = count()


def next_seq() -> int:
    """Like the agent's: microseconds of the clock, strictly increasing."""
    return time.time_ns() // 1000 + next(_seq)


def enroll_node(name: str, token=None) -> channel.Identity:
    """Enroll `name` as an agent would (same checks, same audit), without the Redis hop. A
    node row that already exists (a factory's) is first opened to enrollment, as an admin
    would with "allow re-enrollment"."""
    from console.inventory.models import Node

    Node.objects.filter(name=name).update(reenroll_allowed=True)
    if token is None:
        token, _ = issue_enrollment_token(actor=Actor.system("tests"), name=f"for {name}")
    cred = _issue(name, token, "", "tests")
    return channel.Identity(node=name, kid=cred.pk, key_hex=node_key(name, cred.pk).hex())


def sealed(
    identity: channel.Identity,
    kind: str,
    body: object,
    *,
    t: float | None = None,
    seq: int | None = None,
    node: str | None = None,
    key: bytes | None = None,
) -> bytes:
    """One inbound message as the agent seals it; every part can be forged for attacks."""
    return channel.seal(
        key if key is not None else identity.key,
        {
            "v": channel.PROTOCOL,
            "n": node or identity.node,
            "kid": identity.kid,
            "k": kind,
            "t": time.time() if t is None else t,
            "s": next_seq() if seq is None else seq,
            "b": body,
        },
    )


def deliver(*raws: bytes, inbox=None) -> Counter:
    """Hand messages to a console inbox, as the consumer does with one batch."""
    from console.inventory.inbox import Inbox

    return (inbox or Inbox()).handle_batch(list(raws))
