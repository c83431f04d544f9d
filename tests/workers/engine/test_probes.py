"""HTTP/TCP probes against the kit's fake engine (in-process), and against a closed port."""

from __future__ import annotations

import pytest

from tests.kit import FakeEngine, closed_port
from workers.engine.probes import port_accepts, probe_health, probe_models, scrape_metrics


@pytest.fixture
def engine():
    with FakeEngine(model="tiny", metrics='vllm:num_requests_waiting{engine="0"} 3\n') as fake:
        yield fake


def test_probes_of_a_serving_engine(engine, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")  # must be ignored
    port = engine.port
    assert port_accepts("127.0.0.1", port)
    assert probe_health("0.0.0.0", port) == (True, "/health: HTTP 200")
    assert probe_models("127.0.0.1", port, "tiny") == (True, "/v1/models lists tiny")
    ok, detail = probe_models("127.0.0.1", port, "other")
    assert not ok and "does not list other (lists tiny)" in detail
    assert scrape_metrics("127.0.0.1", port) == {"num_requests_waiting": 3.0}
    engine.health = 503
    assert probe_health("127.0.0.1", port) == (False, "/health: HTTP 503")


def test_probes_of_a_closed_port_answer_without_raising():
    port = closed_port()
    assert not port_accepts("127.0.0.1", port, 0.5)
    ok, detail = probe_health("127.0.0.1", port, 0.5)
    assert not ok and detail.startswith("/health: no answer")
    assert scrape_metrics("127.0.0.1", port, 0.5) == {}


@pytest.mark.security
def test_probes_send_the_engine_key_and_only_when_given(engine):
    port = engine.port
    assert probe_models("127.0.0.1", port, "tiny", api_key="replica-key-0123456789")[0]
    assert probe_health("127.0.0.1", port, api_key="replica-key-0123456789")[0]
    scrape_metrics("127.0.0.1", port, api_key="replica-key-0123456789")
    assert engine.auth == {
        p: {"Bearer replica-key-0123456789"} for p in ("/v1/models", "/health", "/metrics")
    }
    engine.forget()
    probe_models("127.0.0.1", port, "tiny")
    assert engine.auth == {"/v1/models": {None}}
