"""A replica whose host is compromised answers to harm the console: an answer that says it is
hundreds of MB, one server-sent event that never ends, a compressed answer. Each ends as a
failure of that replica's request; the console keeps serving every other model at once, and
nothing it reads is decompressed."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx
import pytest

from console.gateway import app as gateway_app
from tests.console.gateway.test_gateway import call, deploy, token_for
from tests.helpers import make_user
from tests.kit import FakeEngine

pytestmark = pytest.mark.worker


class HostileEngine:
    """Answers every request with `answer` (raw bytes after the request is read), then keeps
    sending `trickle` bytes at a time while the connection lasts (0: closes)."""

    def __init__(self, answer: bytes, trickle: bytes = b"") -> None:
        self.answer, self.trickle = answer, trickle
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                conn.sendall(self.answer)
                deadline = time.monotonic() + 20
                while self.trickle and time.monotonic() < deadline:
                    conn.sendall(self.trickle)
                    time.sleep(0.001)
            except OSError:
                pass

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()


@contextlib.contextmanager
def evil_beside_good(console_web, answer: bytes, trickle: bytes = b""):
    """A hostile replica serving evil-model and a well-behaved one serving good-model; yields
    a viewer's token. On leaving, good-model must answer at once: the console serves on."""
    _, raw = token_for(make_user("alice", "viewer"))
    hostile = HostileEngine(answer, trickle)
    try:
        with FakeEngine(name="good") as good:
            deploy("evil", "evil-model", [hostile.port])
            deploy("good", "good-model", [good.port])
            yield raw
            ok = call(console_web, raw, "/v1/completions", {"model": "good-model", "prompt": "x"})
            assert ok.status_code == 200
    finally:
        hostile.close()


def test_an_answer_over_the_cap_is_a_502_and_the_console_serves_on(console_web):
    huge = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + f"content-length: {gateway_app.MAX_ANSWER + 1}\r\n\r\n".encode()
    )
    with evil_beside_good(console_web, huge, trickle=b"x" * 65536) as raw:
        started = time.monotonic()
        resp = call(console_web, raw, "/v1/completions", {"model": "evil-model", "prompt": "x"})
        assert resp.status_code == 502, resp.text
        assert "over" in resp.json()["error"]["message"]
        assert time.monotonic() - started < 5  # refused on its header, not read to the cap


def test_an_endless_event_is_cut_and_the_console_serves_on(console_web):
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    first = b'data: {"choices": [{"text": "a"}]}\n\n'
    answer = head + f"{len(first):x}\r\n".encode() + first + b"\r\n"
    piece = b"y" * 4096  # an event that never ends: no blank line, ever
    trickle = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    with evil_beside_good(console_web, answer, trickle) as raw:
        started = time.monotonic()
        auth = {"Authorization": f"Bearer {raw}"}
        body = {"model": "evil-model", "prompt": "x", "stream": True}
        url = console_web.url + "/v1/completions"
        with httpx.stream("POST", url, json=body, headers=auth, timeout=30) as s:
            received = b"".join(s.iter_raw())
        assert received.startswith(first)  # what was whole was relayed
        assert len(received) < gateway_app.MAX_EVENT  # the endless rest was not
        assert time.monotonic() - started < 15


def test_a_compressed_answer_is_relayed_as_bytes_never_inflated(console_web):
    import gzip

    alice = make_user("alice", "viewer")
    _, raw = token_for(alice)
    bomb = gzip.compress(b"0" * (50 * 1024 * 1024))  # 50 MB of zeros in ~50 KB
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
        + f"content-length: {len(bomb)}\r\n\r\n".encode()
        + bomb
    )
    hostile = HostileEngine(answer)
    try:
        deploy("evil", "evil-model", [hostile.port])
        resp = call(console_web, raw, "/v1/completions", {"model": "evil-model", "prompt": "x"})
        assert resp.status_code == 200
        assert len(resp.content) == len(bomb)  # the bytes as sent, not 50 MB
    finally:
        hostile.close()
