"""A stand-in OpenAI-compatible replica for gateway tests (a test double: the real-engine
gateway tests are in tests/engine/test_gateway_e2e.py). Served by uvicorn in a thread."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from console.gateway import usage
from console.gateway.models import Usage
from tests.helpers import wait_for


class FakeReplica:
    def __init__(self, name: str, *, status: int = 200, events: int = 3, delay_s: float = 0.0):
        self.name = name
        self.status = status
        self.events = events  # content chunks per streamed answer (< 0: forever)
        self.delay_s = delay_s
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.hold = threading.Event()  # cleared: pause after the first chunk until set
        self.hold.set()
        self.disconnected = threading.Event()
        self.finished = threading.Event()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        app = Starlette(
            routes=[
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
            ]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeReplica:
        self.thread.start()
        wait_for(lambda: self.server.started, 10, message=f"fake replica {self.name} to start")
        return self

    def __exit__(self, *exc) -> None:
        self.hold.set()
        self.server.should_exit = True
        self.thread.join(10)

    async def _complete(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.status != 200:
            return JSONResponse({"error": {"message": "busy"}}, status_code=self.status)
        usage = {"prompt_tokens": 5, "completion_tokens": max(self.events, 0), "total_tokens": 5}
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "text": f"from {self.name}", "finish_reason": "length"}
                    ],
                    "usage": usage,
                }
            )
        include_usage = (body.get("stream_options") or {}).get("include_usage")
        return StreamingResponse(self._stream(include_usage, usage), media_type="text/event-stream")

    async def _stream(self, include_usage: bool, usage: dict):
        i = 0
        try:
            while self.events < 0 or i < self.events:
                chunk = {"id": "cmpl-1", "choices": [{"index": 0, "text": f"{self.name}-{i} "}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                i += 1
                if i == 1:
                    while not self.hold.is_set():
                        await asyncio.sleep(0.01)
                await asyncio.sleep(self.delay_s)
            if include_usage:
                yield f"data: {json.dumps({'id': 'cmpl-1', 'choices': [], 'usage': usage})}\n\n".encode()
            yield b"data: [DONE]\n\n"
            self.finished.set()
        finally:
            if not self.finished.is_set():
                self.disconnected.set()


def refused_port() -> int:
    """A loopback port with nothing listening (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counted(token, model: str, requests: int) -> Usage:
    """The usage row once `requests` were counted (counting runs after the answer is sent)."""

    def row():
        usage.flush()
        return Usage.objects.filter(token=token, model=model, requests__gte=requests).first()

    return wait_for(row, 10, message=f"{requests} requests counted")
