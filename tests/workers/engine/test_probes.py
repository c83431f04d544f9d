"""HTTP/TCP probes against a tiny in-process server, and against a closed port."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.workers.engine.helpers import free_port
from workers.engine.probes import port_accepts, probe_health, probe_models, scrape_metrics

seen: dict[str, str | None] = {}  # path -> the Authorization header it came with


class Handler(BaseHTTPRequestHandler):
    health = 200

    def do_GET(self):  # noqa: N802
        seen[self.path] = self.headers.get("Authorization")
        bodies = {
            "/health": (Handler.health, b""),
            "/v1/models": (200, json.dumps({"data": [{"id": "tiny"}]}).encode()),
            "/metrics": (200, b'vllm:num_requests_waiting{engine="0"} 3\n'),
        }
        status, body = bodies.get(self.path, (404, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    Handler.health = 200


def test_probes_of_a_serving_engine(server, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # must be ignored
    assert port_accepts("127.0.0.1", server)
    assert probe_health("0.0.0.0", server) == (True, "/health: HTTP 200")
    assert probe_models("127.0.0.1", server, "tiny") == (True, "/v1/models lists tiny")
    ok, detail = probe_models("127.0.0.1", server, "other")
    assert not ok and "does not list other (lists tiny)" in detail
    assert scrape_metrics("127.0.0.1", server) == {"num_requests_waiting": 3.0}
    Handler.health = 503
    assert probe_health("127.0.0.1", server) == (False, "/health: HTTP 503")


def test_probes_of_a_closed_port_answer_without_raising():
    port = free_port()
    assert not port_accepts("127.0.0.1", port, 0.5)
    ok, detail = probe_health("127.0.0.1", port, 0.5)
    assert not ok and detail.startswith("/health: no answer")
    assert scrape_metrics("127.0.0.1", port, 0.5) == {}


@pytest.mark.security
def test_probes_send_the_engine_key_and_only_when_given(server):
    seen.clear()
    assert probe_models("127.0.0.1", server, "tiny", api_key="replica-key-0123456789")[0]
    assert probe_health("127.0.0.1", server, api_key="replica-key-0123456789")[0]
    scrape_metrics("127.0.0.1", server, api_key="replica-key-0123456789")
    assert seen == {
        p: "Bearer replica-key-0123456789" for p in ("/v1/models", "/health", "/metrics")
    }
    seen.clear()
    probe_models("127.0.0.1", server, "tiny")
    assert seen == {"/v1/models": None}
