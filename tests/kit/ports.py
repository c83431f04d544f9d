"""Ports for tests. No test assumes a fixed port is free (or closed): it asks here."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
_held: list[socket.socket] = []  # closed_port()'s sockets, kept for the whole session


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now, for a server that must be told
    its port (uvicorn --port, redis-server --port, an EngineSpec, nginx's listen). Another
    program can take it before that server binds: a caller that can, binds port 0 itself
    instead (FakeEngine does); one that cannot, retries with a new port when the start fails."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A loopback port where a connection is made (the kernel completes it from the listen
    backlog) and then nothing is ever answered: a server that hangs, as a stopped Redis or a
    lost network looks to a client. Yields the port."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def closed_port() -> int:
    """A loopback TCP port that refuses connections for the rest of the test session, for
    "nothing listens there" (a dead replica, an unreachable target). The port stays bound by
    a socket that never listens — the kernel answers a connection with a reset — so no other
    program can start listening on it meanwhile (unlike a port that was merely free once)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _held.append(s)
    return s.getsockname()[1]


def on_free_port(start: Callable[[int], T], attempts: int = 3) -> T:
    """`start(port)` with a free_port(); when it fails because that port was taken meanwhile
    (its error says "address already in use"), again with another one. `start` returns once
    its server answers, or raises with the server's output (and stops it)."""
    for attempt in range(1, attempts + 1):
        try:
            return start(free_port())
        except Exception as exc:
            if attempt == attempts or "address already in use" not in str(exc).lower():
                raise
    raise AssertionError("unreachable")
