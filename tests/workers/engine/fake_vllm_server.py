"""A FAKE vLLM OpenAI server, for the supervisor's fast unit tests only.

conftest.py copies this file to <tmp>/vllm/entrypoints/openai/api_server.py and puts <tmp> on
the engine's PYTHONPATH, so the supervisor's real command line
`python -m vllm.entrypoints.openai.api_server --model … --port …` runs it. It serves /health,
/v1/models and /metrics (vLLM's metric names), logs to stdout, and takes behaviours from
FAKE_* environment variables:

  FAKE_START_DELAY_S      sleep before binding the port (phase starting)
  FAKE_LOAD_DELAY_S       /health answers 503 for this long after binding (phase loading)
  FAKE_CRASH_AFTER_S      exit after this many seconds from start, with FAKE_EXIT_CODE (1)
  FAKE_IGNORE_SIGTERM=1   ignore SIGTERM (the child too): only SIGKILL ends it
  FAKE_CHILD=1            start a child process in the same group; logs "child pid N"
  FAKE_HANG=1             /health 200, but requests wait and no token is ever generated
  FAKE_HEALTH_FAIL_FROM_S / FAKE_HEALTH_FAIL_FOR_S   /health 503 during that window
  FAKE_SPAM_LINES_PER_S   log that many numbered lines a second (rotation)

Like vLLM, with VLLM_API_KEY set it answers 401 to /v1/* without `Authorization: Bearer <key>`
(/health and /metrics stay open).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STARTED = time.monotonic()


def env_float(name, default=0.0):
    return float(os.environ.get(name) or default)


def say(*words):
    try:
        print("fake-vllm:", *words, flush=True)
    except OSError:  # log disk full: carry on, as vLLM's logging handlers do
        pass


def health_ok():
    since = time.monotonic() - STARTED - READY_AT
    if since < 0:
        return False
    fail_from = env_float("FAKE_HEALTH_FAIL_FROM_S", -1)
    fail_for = env_float("FAKE_HEALTH_FAIL_FOR_S", 0)
    return not (0 <= fail_from <= since < fail_from + fail_for)


def metrics_text(served):
    hang = os.environ.get("FAKE_HANG") == "1"
    tokens = 7.0 if hang else 7.0 + int((time.monotonic() - STARTED) * 20)
    waiting = 2 if hang else 0
    labels = f'engine="0",model_name="{served}"'
    return (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        f"vllm:num_requests_running{{{labels}}} 1.0\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.25\n"
        f"vllm:generation_tokens_total{{{labels}}} {tokens}\n"
        f"vllm:prompt_tokens_total{{{labels}}} 40.0\n"
    )


def authorized(headers):
    key = os.environ.get("VLLM_API_KEY")
    return not key or headers.get("Authorization") == f"Bearer {key}"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.startswith("/v1") and not authorized(self.headers):
            self.answer(401, b'{"error": "Unauthorized"}')
        elif self.path == "/health":
            self.answer(200 if health_ok() else 503, b"")
        elif self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": ARGS.served_model_name, "object": "model"}]}
            self.answer(200, json.dumps(body).encode())
        elif self.path == "/metrics":
            self.answer(200, metrics_text(ARGS.served_model_name).encode())
        else:
            self.answer(404, b"")

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def start_child(ignore_term):
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "time.sleep(3600)\n"
    child = subprocess.Popen([sys.executable, "-c", code])
    say("child pid", child.pid)


def crash_later(after, code):
    def crash():
        time.sleep(after)
        say("crashing with exit code", code)
        os._exit(code)

    threading.Thread(target=crash, daemon=True).start()


def spam(per_second):
    def loop():
        n = 0
        while True:
            say(f"spam {n:06d} " + "x" * 40)
            n += 1
            time.sleep(1 / per_second)

    threading.Thread(target=loop, daemon=True).start()


def main():
    global ARGS, READY_AT
    parser = argparse.ArgumentParser()
    for flag in ("--model", "--served-model-name", "--host", "--port"):
        parser.add_argument(flag)
    ARGS, unknown = parser.parse_known_args()
    ignore = os.environ.get("FAKE_IGNORE_SIGTERM") == "1"
    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else lambda *a: os._exit(0))
    say("argv", json.dumps(sys.argv[1:]))
    for name in ("ASCEND_RT_VISIBLE_DEVICES", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE"):
        say(f"env {name}={os.environ.get(name)}")
    if os.environ.get("FAKE_CHILD") == "1":
        start_child(ignore)
    if os.environ.get("FAKE_CRASH_AFTER_S"):
        crash_later(env_float("FAKE_CRASH_AFTER_S"), int(os.environ.get("FAKE_EXIT_CODE", "1")))
    if os.environ.get("FAKE_SPAM_LINES_PER_S"):
        spam(env_float("FAKE_SPAM_LINES_PER_S"))
    time.sleep(env_float("FAKE_START_DELAY_S"))
    READY_AT = time.monotonic() - STARTED + env_float("FAKE_LOAD_DELAY_S")
    server = ThreadingHTTPServer((ARGS.host, int(ARGS.port)), Handler)
    say(f"Starting vLLM server on http://{ARGS.host}:{ARGS.port}")
    say("Application startup complete.")
    server.serve_forever()


ARGS = None
READY_AT = 0.0
if __name__ == "__main__":
    main()
