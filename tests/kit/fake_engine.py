"""One fake vLLM OpenAI server for tests: real sockets, real timing, standard library only.

In a test (it binds port 0: never a port assumed free):

    with FakeEngine(ttft_s=0.05, itl_s=0.01) as engine:
        ... engine.url / engine.port ...
    engine.requests   # the completion request bodies, in arrival order
    engine.headers    # their headers (names lower-cased)
    engine.auth       # path -> every Authorization header it came with (None: none)

As the engine the supervisor starts: install_as_vllm(root) copies this file to
<root>/vllm/entrypoints/openai/api_server.py and <root>/vllm/entrypoints/cli/main.py, so with
<root> on PYTHONPATH the real command lines `python -m vllm.entrypoints.openai.api_server
--model ... --port ...` and a group member's `python -m vllm.entrypoints.cli.main serve MODEL
...` run main() below. A `serve ... --headless` member (a group's follower) serves no HTTP: it
logs and sleeps until signalled, as vLLM's headless DP ranks do. main() takes behaviours from
FAKE_* environment variables:

  FAKE_START_DELAY_S      sleep before binding the port (phase starting)
  FAKE_LOAD_DELAY_S       /health answers 503 for this long after binding (phase loading)
  FAKE_CRASH_AFTER_S      exit after this many seconds from start, with FAKE_EXIT_CODE (1)
  FAKE_IGNORE_SIGTERM=1   ignore SIGTERM (the child too): only SIGKILL ends it
  FAKE_CHILD=1            start a child process in the same group; logs "child pid N"
  FAKE_HANG=1             /health 200, but requests wait and no token is ever generated
  FAKE_HEALTH_FAIL_FROM_S / FAKE_HEALTH_FAIL_FOR_S   /health 503 during that window
  FAKE_SPAM_LINES_PER_S   log that many numbered lines a second (rotation)

What it answers, as vLLM does (HTTP/1.1, keep-alive):
  GET  /health                 `health` (a status, or a function returning one), no body
  GET  /v1/models              lists `model`
  GET  /metrics                `metrics` (text, or a function returning it); by default
                               vLLM's metric names, generation tokens growing 20 a second
  POST /tokenize               {"count": <prompt tokens>}
  POST /v1/completions, /v1/chat/completions
      for any model name; `status` other than 200, or every `fail_every`-th request: that
      status (500) with an OpenAI error body. Otherwise `tokens` completion tokens (None:
      the request's max_tokens, else 16; -1: stream forever) — a JSON answer "from <name>",
      or with "stream": true server-sent events: `ttft_s` before the first chunk, `itl_s`
      between chunks of `tokens_per_chunk` tokens, texts "<name>-0 ", "<name>-1 ", ...; the
      usage chunk when stream_options.include_usage; then [DONE]. Prompt tokens: `prompt_tokens`,
      or 2 a word of the prompt.
With `api_key` (main(): VLLM_API_KEY), /v1/* answers 401 without `Authorization: Bearer <key>`;
/health, /metrics and /tokenize stay open, as in vLLM.

Controls while it runs: `hold` (an Event; cleared: a stream pauses after its first chunk until
it is set), `finished` / `disconnected` (Events: a stream ran to its end / its client went
away), `in_flight` / `max_in_flight`, `health` and `status` (plain attributes), forget().
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions


class FakeEngine:
    def __init__(
        self,
        *,
        name: str = "fake",
        model: str = "tiny",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        ttft_s: float = 0.05,
        itl_s: float = 0.01,
        tokens: int | None = None,
        tokens_per_chunk: int = 1,
        prompt_tokens: int | None = None,
        status: int = 200,
        fail_every: int = 0,
        hang: bool = False,
        health: int | Callable[[], int] = 200,
        metrics: str | Callable[[], str] | None = None,
    ) -> None:
        self.name, self.model, self.api_key = name, model, api_key
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.tokens, self.tokens_per_chunk = tokens, tokens_per_chunk
        self.prompt_tokens = prompt_tokens
        self.status, self.fail_every, self.hang = status, fail_every, hang
        self.health, self.metrics = health, metrics
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.auth: dict[str, set[str | None]] = {}
        self.in_flight = self.max_in_flight = 0
        self.hold = threading.Event()
        self.hold.set()
        self.finished = threading.Event()
        self.disconnected = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._started_at = time.monotonic()
        self.server = ThreadingHTTPServer((host, port), _handler(self))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None

    # --- life ------------------------------------------------------------------------------
    def start(self) -> FakeEngine:
        """Serve from a thread (the port is bound already, at construction)."""
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and cut every open connection (keep-alive ones too); idempotent."""
        self._closing.set()
        self.hold.set()
        if self._thread is not None:
            self.server.shutdown()
            self._thread = None
        self.server.server_close()
        with self._lock:
            open_now = list(self._connections)
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> FakeEngine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def forget(self) -> None:
        """Forget the requests, headers and Authorization headers seen so far."""
        with self._lock:
            self.requests.clear()
            self.headers.clear()
            self.auth.clear()

    # --- answers ---------------------------------------------------------------------------
    def health_status(self) -> int:
        return self.health() if callable(self.health) else self.health

    def metrics_text(self) -> str:
        if callable(self.metrics):
            return self.metrics()
        if self.metrics is not None:
            return self.metrics
        generated = 7.0 if self.hang else 7.0 + int((time.monotonic() - self._started_at) * 20)
        labels = f'engine="0",model_name="{self.model}"'
        return (
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {2 if self.hang else 0}\n"
            f"vllm:num_requests_running{{{labels}}} 1.0\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.25\n"
            f"vllm:generation_tokens_total{{{labels}}} {generated}\n"
            f"vllm:prompt_tokens_total{{{labels}}} 40.0\n"
        )

    def count_prompt(self, body: dict) -> int:
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        prompt = body.get("prompt")
        if prompt is None:  # chat: the words of every message
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages") or [])
        return 2 * len(str(prompt).split())

    def completion_tokens(self, body: dict) -> int:
        if self.tokens is not None:
            return self.tokens
        return int(body.get("max_tokens") or DEFAULT_MAX_TOKENS)

    def authorized(self, headers) -> bool:
        return not self.api_key or headers.get("Authorization") == f"Bearer {self.api_key}"


def _handler(engine: FakeEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and chunked streams, as uvicorn serves vLLM

        def setup(self) -> None:
            super().setup()
            with engine._lock:
                engine._connections.add(self.connection)

        def finish(self) -> None:
            with engine._lock:
                engine._connections.discard(self.connection)
            try:
                super().finish()
            except OSError:
                pass

        def log_message(self, *args) -> None:  # quiet
            pass

        def _seen(self) -> None:
            with engine._lock:
                engine.auth.setdefault(self.path, set()).add(self.headers.get("Authorization"))

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._seen()
            if self.path.startswith("/v1") and not engine.authorized(self.headers):
                self._json(401, {"error": "Unauthorized"})
            elif self.path == "/health":
                self._send(engine.health_status(), b"", "text/plain")
            elif self.path == "/v1/models":
                model = {"id": engine.model, "object": "model", "owned_by": "vllm"}
                self._json(200, {"object": "list", "data": [model]})
            elif self.path == "/metrics":
                self._send(200, engine.metrics_text().encode(), "text/plain; version=0.0.4")
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self._seen()
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/v1") and not engine.authorized(self.headers):
                return self._json(401, {"error": "Unauthorized"})
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return self._json(400, _error("not JSON", 400))
            if self.path == "/tokenize":
                return self._json(200, {"count": engine.count_prompt(body)})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._json(404, {"detail": "Not Found"})
            with engine._lock:
                engine.requests.append(body)
                engine.headers.append({k.lower(): v for k, v in self.headers.items()})
                n = len(engine.requests)
            if engine.status != 200:
                return self._json(engine.status, _error("busy", engine.status))
            if engine.fail_every and n % engine.fail_every == 0:
                return self._json(500, _error("boom", 500))
            if engine.hang:  # accepted, never a token
                engine._closing.wait()
                self.close_connection = True
                return None
            with engine._lock:
                engine.in_flight += 1
                engine.max_in_flight = max(engine.max_in_flight, engine.in_flight)
            try:
                if body.get("stream"):
                    self._stream(body)
                else:
                    self._answer(body)
            except ConnectionError:  # BrokenPipe, ConnectionReset: the client went away
                engine.disconnected.set()
                self.close_connection = True
            finally:
                with engine._lock:
                    engine.in_flight -= 1
            return None

        def _answer(self, body: dict) -> None:
            time.sleep(engine.ttft_s)
            text = f"from {engine.name}"
            chat = self.path.endswith("/chat/completions")
            choice = {"index": 0, "finish_reason": "length"}
            choice.update(
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            )
            self._json(
                200,
                {
                    "id": "cmpl-1",
                    "object": "chat.completion" if chat else "text_completion",
                    "model": body.get("model"),
                    "choices": [choice],
                    "usage": _usage(
                        engine.count_prompt(body), max(engine.completion_tokens(body), 0)
                    ),
                },
            )

        def _stream(self, body: dict) -> None:
            tokens = engine.completion_tokens(body)
            chunks = math.inf if tokens < 0 else math.ceil(tokens / engine.tokens_per_chunk)
            chat = self.path.endswith("/chat/completions")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            time.sleep(engine.ttft_s)
            i = 0
            while i < chunks and not engine._closing.is_set():
                if i:
                    time.sleep(engine.itl_s)
                text = f"{engine.name}-{i} "
                choice = (
                    {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                )
                self._event({"id": "cmpl-1", "choices": [choice]})
                if i == 0:
                    engine.hold.wait()
                i += 1
            if (body.get("stream_options") or {}).get("include_usage") and tokens >= 0:
                usage = _usage(engine.count_prompt(body), tokens)
                self._event({"id": "cmpl-1", "choices": [], "usage": usage})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
            engine.finished.set()

        def _event(self, data: dict) -> None:
            self._chunk(f"data: {json.dumps(data)}\n\n".encode())

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _json(self, status: int, body: dict) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _usage(prompt: int, completion: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _error(message: str, status: int) -> dict:
    return {"error": {"message": message, "type": "BadRequestError", "code": status}}


def install_as_vllm(root: Path) -> Path:
    """Make `python -m vllm.entrypoints.openai.api_server` run this file (main() below) for a
    python whose PYTHONPATH holds `root`. Returns root."""
    package = root / "vllm" / "entrypoints" / "openai"
    cli = root / "vllm" / "entrypoints" / "cli"
    package.mkdir(parents=True)
    cli.mkdir()
    for directory in (root / "vllm", root / "vllm" / "entrypoints", package, cli):
        (directory / "__init__.py").write_text("")
    shutil.copy(Path(__file__), package / "api_server.py")
    shutil.copy(Path(__file__), cli / "main.py")
    return root


# --- as a process: the engine the supervisor starts ----------------------------------------
def _env_float(name: str, default: float = 0.0) -> float:
    return float(os.environ.get(name) or default)


def _say(*words) -> None:
    try:
        print("fake-vllm:", *words, flush=True)
    except OSError:  # log disk full: carry on, as vLLM's logging handlers do
        pass


def _start_child(ignore_term: bool) -> None:
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "time.sleep(3600)\n"
    child = subprocess.Popen([sys.executable, "-c", code])
    _say("child pid", child.pid)


def _crash_later(after: float, code: int) -> None:
    def crash() -> None:
        time.sleep(after)
        _say("crashing with exit code", code)
        os._exit(code)

    threading.Thread(target=crash, daemon=True).start()


def _spam(per_second: float) -> None:
    def loop() -> None:
        n = 0
        while True:
            _say(f"spam {n:06d} " + "x" * 40)
            n += 1
            time.sleep(1 / per_second)

    threading.Thread(target=loop, daemon=True).start()


def _health_after(ready_at: float) -> Callable[[], int]:
    """/health: 503 until `ready_at` (monotonic), then 200 but in the FAKE_HEALTH_FAIL window."""
    fail_from = _env_float("FAKE_HEALTH_FAIL_FROM_S", -1)
    fail_for = _env_float("FAKE_HEALTH_FAIL_FOR_S", 0)

    def status() -> int:
        since = time.monotonic() - ready_at
        if since < 0 or 0 <= fail_from <= since < fail_from + fail_for:
            return 503
        return 200

    return status


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:  # vLLM's CLI: `serve MODEL [flags]`
        argv = ["--model", *argv[1:2], *argv[2:]]
    parser = argparse.ArgumentParser()
    for flag in ("--model", "--served-model-name", "--host", "--port"):
        parser.add_argument(flag)
    parser.add_argument("--headless", action="store_true")
    args, _unknown = parser.parse_known_args(argv)
    ignore = os.environ.get("FAKE_IGNORE_SIGTERM") == "1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else lambda *a: os._exit(0))
    _say("argv", json.dumps(sys.argv[1:]))
    for name in ("ASCEND_RT_VISIBLE_DEVICES", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE"):
        _say(f"env {name}={os.environ.get(name)}")
    if os.environ.get("FAKE_CHILD") == "1":
        _start_child(ignore)
    if os.environ.get("FAKE_CRASH_AFTER_S"):
        _crash_later(_env_float("FAKE_CRASH_AFTER_S"), int(os.environ.get("FAKE_EXIT_CODE", "1")))
    if os.environ.get("FAKE_SPAM_LINES_PER_S"):
        _spam(_env_float("FAKE_SPAM_LINES_PER_S"))
    if args.headless:  # a group's follower: DP ranks only, no API server
        _say("headless: running DP ranks; the leader serves the API")
        while True:
            time.sleep(3600)
    time.sleep(_env_float("FAKE_START_DELAY_S"))
    engine = FakeEngine(
        model=args.served_model_name,
        host=args.host,
        port=int(args.port),
        api_key=os.environ.get("VLLM_API_KEY"),
        hang=os.environ.get("FAKE_HANG") == "1",
        health=_health_after(time.monotonic() + _env_float("FAKE_LOAD_DELAY_S")),
    )
    _say(f"Starting vLLM server on http://{args.host}:{args.port}")
    _say("Application startup complete.")
    engine.server.serve_forever()


if __name__ == "__main__":
    main()
