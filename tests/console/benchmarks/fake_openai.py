"""A small OpenAI-compatible streaming server (a test double for vLLM's): `/v1/completions`
with stream=true answers `max_tokens` chunks after `ttft_s`, one every `itl_s`, then a usage
chunk and [DONE]; `/tokenize` counts 2 tokens per word. Real sockets and real timing."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeEngine:
    def __init__(
        self,
        *,
        ttft_s: float = 0.05,
        itl_s: float = 0.01,
        fail_every: int = 0,
        tokens_per_chunk: int = 1,
    ) -> None:
        self.ttft_s, self.itl_s, self.fail_every = ttft_s, itl_s, fail_every
        self.tokens_per_chunk = tokens_per_chunk
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.bodies: list[dict] = []
        self.auth: dict[str, set[str | None]] = {}  # path -> Authorization headers seen
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with engine._lock:
                    engine.auth.setdefault(self.path, set()).add(self.headers.get("Authorization"))
                if self.path == "/tokenize":
                    return self._json(200, {"count": 2 * len(body["prompt"].split())})
                with engine._lock:
                    engine.requests += 1
                    n = engine.requests
                    engine.bodies.append(body)
                if engine.fail_every and n % engine.fail_every == 0:
                    return self._json(500, {"error": "boom"})
                with engine._lock:
                    engine.in_flight += 1
                    engine.max_in_flight = max(engine.max_in_flight, engine.in_flight)
                try:
                    self._stream(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client cut it off (cancel)
                finally:
                    with engine._lock:
                        engine.in_flight -= 1

            def _stream(self, body: dict) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                time.sleep(engine.ttft_s)
                for i in range(0, body["max_tokens"], engine.tokens_per_chunk):
                    if i:
                        time.sleep(engine.itl_s)
                    chunk = {"choices": [{"index": 0, "text": f" w{i}"}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                usage = {
                    "prompt_tokens": 2 * len(body["prompt"].split()),
                    "completion_tokens": body["max_tokens"],
                }
                self.wfile.write(
                    f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
                )
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        return Handler
