"""The /v1 gateway in a real uvicorn process against stand-in replicas: auth and per-token
model access, least-loaded routing, failover before the first byte, streaming without
buffering, client disconnects reaching the replica, usage counted per token and model."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from console.accounts.models import ApiToken
from console.accounts.services import Actor, create_token
from console.deployments.engines import metrics_key
from console.deployments.models import Replica, engine_api_key
from console.hot import get_redis
from tests.console.gateway.support import counted
from tests.helpers import make_user
from tests.kit import FakeEngine, closed_port, make_deployment, make_node, make_replica, wait_for

pytestmark = pytest.mark.worker


def deploy(name: str, model: str, ports: list[int]) -> list[Replica]:
    """A CPU deployment serving `model` with one ready replica per port (on <name>-node)."""
    dep = make_deployment(
        name, model_path="/models/x", served_model_name=model, device="cpu", ports=ports
    )
    return list(dep.replica_set.all())


def token_for(user, **kw) -> tuple[ApiToken, str]:
    return create_token(actor=Actor(user=user, name=user.username), name="gw", **kw)


@pytest.fixture
def alice(transactional_db):
    return make_user("alice", "viewer")


def call(web, raw: str | None, path: str, body: dict | None = None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {raw}"} if raw else {}
    if body is None:
        return httpx.get(web.url + path, headers=headers, timeout=30)
    return httpx.post(web.url + path, json=body, headers=headers, timeout=30, **kw)


def test_tokens_and_model_access(console_web, alice):
    with FakeEngine(name="a") as a, FakeEngine(name="b") as b:
        deploy("dep-a", "model-a", [a.port])
        (b_replica,) = deploy("dep-b", "model-b", [b.port])
        _, any_model = token_for(alice)
        _, only_a = token_for(alice, allowed_models=["model-a"])
        _, expired = token_for(alice)
        ApiToken.objects.filter(pk=ApiToken.objects.order_by("-pk").first().pk).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        nobody = make_user("nobody", None)
        _, roleless = token_for(nobody)
        req = {"model": "model-b", "prompt": "hi", "max_tokens": 2}

        assert call(console_web, None, "/v1/completions", req).status_code == 401
        assert call(console_web, "npc_not-a-token", "/v1/completions", req).status_code == 401
        assert call(console_web, expired, "/v1/completions", req).status_code == 401
        assert call(console_web, roleless, "/v1/models").status_code == 401
        denied = call(console_web, only_a, "/v1/completions", req)
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "model_not_allowed"
        assert b.requests == []  # refused before reaching the replica

        ok = call(console_web, any_model, "/v1/completions", req)
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["text"] == "from b"
        # the console token never leaves the console; the replica's engine key goes instead
        assert b.headers[0]["authorization"] == f"Bearer {engine_api_key(b_replica.pk)}"
        assert not any(any_model in v for v in b.headers[0].values())

        listed = call(console_web, only_a, "/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["model-a"]
        listed = call(console_web, any_model, "/v1/models").json()
        assert [m["id"] for m in listed["data"]] == ["model-a", "model-b"]


def test_bad_requests_are_openai_errors_not_5xx(console_web, alice):
    _, raw = token_for(alice)
    deploy("dep-none", "sleeping", [])
    cases = [
        ({"prompt": "no model"}, 400, "model"),
        ({"model": 7}, 400, "model"),
        ({"model": "unknown-model"}, 404, "model"),
        ({"model": "sleeping"}, 503, None),
    ]
    for body, status, param in cases:
        resp = call(console_web, raw, "/v1/completions", body)
        assert resp.status_code == status, (body, resp.text)
        assert resp.json()["error"]["param"] == param
    junk = httpx.post(
        console_web.url + "/v1/chat/completions",
        content=b"\x00not json",
        headers={"Authorization": f"Bearer {raw}"},
    )
    assert junk.status_code == 400
    huge = httpx.post(
        console_web.url + "/v1/completions",
        content=b"x" * (9 * 1024 * 1024),
        headers={"Authorization": f"Bearer {raw}"},
        timeout=30,
    )
    assert huge.status_code == 413


def test_a_model_served_only_on_simulated_nodes_is_a_clear_503_at_once(console_web, alice):
    """A simulated replica (make demo) reports ready, but nothing serves its port: the gateway
    does not try it (no connect timeout, no other program on that port) and says why."""
    _, raw = token_for(alice)
    with FakeEngine(name="squatter") as squatter:  # what else may listen on a shared demo host
        node = make_node("demo-sim", address="127.0.0.1", simulated=True)
        make_deployment(
            "dep-sim",
            model_path="/models/x",
            served_model_name="model-sim",
            device="cpu",
            node=node,
            ports=[squatter.port],
        )
        resp = call(console_web, raw, "/v1/completions", {"model": "model-sim", "prompt": "x"})
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "simulated_replicas_only"
        assert "SIMULATED" in resp.json()["error"]["message"]
        assert resp.elapsed.total_seconds() < 3  # answered, not a connect timeout
        assert squatter.requests == []
        assert call(console_web, raw, "/v1/models").json()["data"] == []


def test_failover_before_the_first_byte(console_web, alice):
    _, raw = token_for(alice)
    with FakeEngine(name="busy", status=503) as busy, FakeEngine(name="good") as good:
        deploy("dep-f", "model-f", [closed_port(), busy.port, good.port])
        for _ in range(4):
            resp = call(console_web, raw, "/v1/completions", {"model": "model-f", "prompt": "x"})
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["text"] == "from good"
            assert resp.headers["x-npc-replica"] == "dep-f/2"
        assert busy.requests  # it was tried, refused, and the request went on


@pytest.mark.security
def test_a_node_address_that_is_no_ip_address_gives_no_upstream(console_web, alice):
    """The SSRF of issue 12: with string formatting, this address made the upstream URL
    http://127.0.0.1:<fake>/v1/completions?x=:<port>, so the request reached the fake."""
    _, raw = token_for(alice)
    with FakeEngine(name="target") as target:
        node = make_node("evil-node", address=f"127.0.0.1:{target.port}/v1/completions?x=")
        dep = make_deployment(
            "dep-npu", model_path="/models/x", served_model_name="model-n", device="npu"
        )
        make_replica(dep, node=node)
        resp = call(console_web, raw, "/v1/completions", {"model": "model-n", "prompt": "x"})
        assert resp.status_code == 503, resp.text
        assert target.requests == []


def test_all_replicas_refusing_is_a_503_naming_them(console_web, alice):
    _, raw = token_for(alice)
    deploy("dep-dead", "model-dead", [closed_port(), closed_port()])
    resp = call(console_web, raw, "/v1/completions", {"model": "model-dead", "prompt": "x"})
    assert resp.status_code == 503
    assert "dep-dead/0" in resp.json()["error"]["message"]
    assert "dep-dead/1" in resp.json()["error"]["message"]


def test_least_loaded_replica_by_scraped_metrics(console_web, alice):
    _, raw = token_for(alice)
    with FakeEngine(name="a") as a, FakeEngine(name="b") as b:
        ra, rb = deploy("dep-l", "model-l", [a.port, b.port])
        redis = get_redis()
        redis.set(
            metrics_key(ra.pk), json.dumps({"num_requests_running": 6, "num_requests_waiting": 3})
        )
        redis.set(
            metrics_key(rb.pk), json.dumps({"num_requests_running": 1, "num_requests_waiting": 0})
        )
        for _ in range(6):
            call(console_web, raw, "/v1/completions", {"model": "model-l", "prompt": "x"})
        assert len(b.requests) == 6 and a.requests == []


def test_streaming_is_relayed_as_it_arrives_and_usage_counted(console_web, alice):
    token, raw = token_for(alice)
    with FakeEngine(name="s", tokens=5, prompt_tokens=5) as s:
        deploy("dep-s", "model-s", [s.port])
        s.hold.clear()  # the replica sends one chunk, then waits
        body = {"model": "model-s", "prompt": "x", "stream": True}
        with httpx.stream(
            "POST",
            console_web.url + "/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {raw}"},
            timeout=30,
        ) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            lines = resp.iter_lines()
            first = next(line for line in lines if line)
            assert "s-0" in first  # arrived while the replica is still holding the rest
            assert not s.finished.is_set()
            s.hold.set()
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        payloads = [json.loads(x[6:]) for x in rest[:-1]]
        assert [p["choices"][0]["text"] for p in payloads] == [f"s-{i} " for i in range(1, 5)]
        # the gateway asked the replica for usage, and did not pass it to a client that did not
        assert s.requests[0]["stream_options"] == {"include_usage": True}
        assert all(p["choices"] for p in payloads)

        # a client that asks for usage gets it
        asked = {**body, "stream_options": {"include_usage": True}}
        text = httpx.post(
            console_web.url + "/v1/completions",
            json=asked,
            headers={"Authorization": f"Bearer {raw}"},
            timeout=30,
        ).text
        assert '"usage": {"prompt_tokens": 5' in text

    row = counted(token, "model-s", 2)
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (2, 0, 10, 10)


def test_client_disconnect_reaches_the_replica(console_web, alice):
    _, raw = token_for(alice)
    with FakeEngine(name="slow", tokens=-1, itl_s=0.05) as slow:
        deploy("dep-d", "model-d", [slow.port])
        with httpx.stream(
            "POST",
            console_web.url + "/v1/completions",
            json={"model": "model-d", "prompt": "x", "stream": True},
            headers={"Authorization": f"Bearer {raw}"},
            timeout=30,
        ) as resp:
            lines = resp.iter_lines()
            assert "slow-0" in next(line for line in lines if line)
        # the client hung up; the replica's stream must be cancelled, not run on forever
        wait_for(slow.disconnected.is_set, 5, message="the replica to see the disconnect")


def test_usage_page_and_api(console_web, alice, client):
    token, raw = token_for(alice)
    with FakeEngine(name="u") as u:
        deploy("dep-u", "model-u", [u.port])
        for _ in range(3):
            call(console_web, raw, "/v1/completions", {"model": "model-u", "prompt": "x"})
    other = make_user("bob", "viewer")
    _, bob_raw = token_for(other)
    counted(token, "model-u", 3)  # counted after each answer went out
    client.force_login(alice)
    report = client.get("/api/v1/gateway/usage").json()
    assert report["totals"]["requests"] == 3
    assert [(r["model"], r["requests"], r["token_name"]) for r in report["rows"]] == [
        ("model-u", 3, "gw")
    ]
    page = client.get("/gateway/")
    assert page.status_code == 200
    assert b"model-u" in page.content and b"/v1" in page.content
    client.force_login(other)  # bob sees none of alice's usage
    assert client.get("/api/v1/gateway/usage").json()["rows"] == []
    assert bob_raw
