"""Gateway rate limits (console/gateway/limits.py): which limits bind a request, exact counts
across processes sharing one Redis, 429 in OpenAI's shape with Retry-After through the real
gateway, the lease that frees a dead process's slots, and the admin API and page."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from redis import asyncio as aioredis

from console.accounts.models import ApiToken, AuditEntry
from console.accounts.services import Actor
from console.gateway import limits
from console.gateway.limits import Admission, Limiter, Refusal, Table
from console.gateway.models import RateLimit
from console.gateway.services import set_rate_limit
from tests.console.gateway.support import counted
from tests.console.gateway.test_gateway import call, deploy, token_for
from tests.helpers import make_user
from tests.kit import FakeEngine, wait_for


def row(rpm=None, tpm=None, conc=None) -> dict:
    return {"requests_per_minute": rpm, "tokens_per_minute": tpm, "concurrent": conc}


def test_which_limits_bind_a_request():
    table = Table(
        rows={
            (7, "m"): row(rpm=5),
            (7, ""): row(tpm=100),
            (None, "m"): row(conc=2),
            (None, ""): row(rpm=60),
            (8, "other"): row(rpm=1),
        }
    )
    scopes = [lim.scope for lim in table.binding(7, "m")]
    assert scopes == ["token 7 on model 'm'", "token 7", "model 'm'"]
    # token 9 has no limit of its own: the default binds it, with its own counter
    (default, model) = table.binding(9, "m")
    assert default.requests_per_minute == 60 and default.key.endswith(":t9")
    assert model.concurrent == 2
    assert [lim.scope for lim in table.binding(8, "x")] == ["token 8"]
    assert Table(rows={}).binding(1, "m") == ()


async def _admit_many(redis_url: str, limiters: list[Limiter], n: int, model: str = "m"):
    clients = [aioredis.Redis.from_url(redis_url) for _ in limiters]
    try:
        results = await asyncio.gather(
            *(
                limiters[i % len(limiters)].admit(clients[i % len(limiters)], 1, model)
                for i in range(n)
            )
        )
    finally:
        for c in clients:
            await c.aclose()
    return results


def _limiter(rows: dict) -> Limiter:
    limiter = Limiter()
    limiter.table = Table(at=float("inf"), rows=rows, version="0")
    return limiter


def test_limits_are_exact_across_processes(redis_url, clean_redis):
    """Two limiters (two console processes) on one Redis: 60 sent at once, exactly 7 let in."""
    rows = {(1, ""): row(rpm=7)}
    results = asyncio.run(_admit_many(redis_url, [_limiter(rows), _limiter(rows)], 60))
    admitted = [r for r in results if isinstance(r, Admission)]
    refused = [r for r in results if isinstance(r, Refusal)]
    assert len(admitted) == 7 and len(refused) == 53
    assert {r.what for r in refused} == {"requests"}
    assert all(1 <= r.retry_after <= 60 for r in refused)
    assert "7 requests/min for token 1" in refused[0].message


def test_concurrency_slots_free_on_release_and_when_a_process_dies(
    redis_url, clean_redis, monkeypatch
):
    rows = {(1, ""): row(conc=2)}

    async def scenario():
        r = aioredis.Redis.from_url(redis_url)
        try:
            lim = _limiter(rows)
            a = await lim.admit(r, 1, "m")
            b = await lim.admit(r, 1, "m")
            c = await lim.admit(r, 1, "m")
            assert isinstance(a, Admission) and isinstance(b, Admission)
            assert isinstance(c, Refusal) and c.what == "concurrent" and c.retry_after == 1
            await lim.release(r, a, tokens=0)
            assert isinstance(await lim.admit(r, 1, "m"), Admission)
            # b's process "dies" without releasing: its lease ends and the slot is free again
            monkeypatch.setattr(limits, "LEASE_S", 0.2)
            short = _limiter(rows)
            await r.delete(f"{limits.KEY}t1:c")
            await short.admit(r, 1, "m")
            await short.admit(r, 1, "m")
            assert isinstance(await short.admit(r, 1, "m"), Refusal)
            deadline = asyncio.get_running_loop().time() + 5
            while asyncio.get_running_loop().time() < deadline:
                if isinstance(await short.admit(r, 1, "m"), Admission):
                    return True
                await asyncio.sleep(0.05)
            return False
        finally:
            await r.aclose()

    assert asyncio.run(scenario()), "a dead holder's slot was never freed"


def test_tokens_per_minute_count_what_answers_used(redis_url, clean_redis):
    rows = {(None, "m"): row(tpm=100)}

    async def scenario():
        r = aioredis.Redis.from_url(redis_url)
        try:
            lim = _limiter(rows)
            first = await lim.admit(r, 1, "m")
            await lim.release(r, first, tokens=60)
            second = await lim.admit(r, 2, "m")  # another token: the model's limit is shared
            assert isinstance(second, Admission)
            await lim.release(r, second, tokens=60)
            third = await lim.admit(r, 3, "m")
            assert isinstance(third, Refusal) and third.what == "tokens"
            assert "100 tokens/min for model 'm'" in third.message
        finally:
            await r.aclose()

    asyncio.run(scenario())


def test_a_stale_table_is_read_again_before_admitting(redis_url, clean_redis, gateway_db_thread):
    """A limit set in one process binds the next request in every other, not REFRESH_S later;
    with no limit at all, requests cost no Redis round trip and the first limit binds within
    EMPTY_TRUST_S."""
    admin = make_user("root", "admin")
    token, _ = token_for(admin)
    other, _ = token_for(admin)
    actor = Actor(user=admin, name="root")
    lim = Limiter()

    async def admit():
        r = aioredis.Redis.from_url(redis_url)
        try:
            return await lim.admit(r, token.pk, "m")
        finally:
            await r.aclose()

    first = asyncio.run(admit())  # table read: empty
    assert isinstance(first, Admission) and not first.request_id  # no round trip
    set_rate_limit(actor=actor, token_id=token.pk, requests_per_minute=1)
    wait_for(
        lambda: isinstance(asyncio.run(admit()), Refusal),
        limits.EMPTY_TRUST_S + 5,
        message="the first limit ever set binds",
    )
    # with limits in the table, a change binds the very next request
    set_rate_limit(actor=actor, token_id=other.pk, concurrent=1)
    set_rate_limit(actor=actor, token_id=token.pk, concurrent=1)
    held = asyncio.run(admit())
    assert isinstance(held, Admission) and held.limits
    assert isinstance(asyncio.run(admit()), Refusal)


def test_redis_down_serves_without_limits(caplog):
    lim = _limiter({(1, ""): row(rpm=1)})

    async def scenario():
        r = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
        try:
            return [await lim.admit(r, 1, "m") for _ in range(3)]
        finally:
            await r.aclose()

    results = asyncio.run(scenario())
    assert all(isinstance(r, Admission) and not r.limits for r in results)
    assert "rate limits not enforced" in caplog.text


def limits_in_force(web, admin, model: str) -> None:
    """Wait until the gateway process enforces the limits set so far: a probe token limited to
    one request a minute gets its 429 (a process that saw no limit yet trusts its empty table
    for limits.EMPTY_TRUST_S)."""
    _, probe = token_for(admin)
    token_id = ApiToken.objects.order_by("-pk").first().pk
    set_rate_limit(actor=Actor(user=admin, name="root"), token_id=token_id, requests_per_minute=1)
    req = {"model": model, "prompt": "probe", "max_tokens": 1}
    wait_for(
        lambda: call(web, probe, "/v1/completions", req).status_code == 429,
        10,
        message="the gateway enforces the limits",
    )


@pytest.mark.worker
def test_the_gateway_answers_429_with_retry_after_and_counts_it(console_web, clean_redis):
    alice = make_user("alice", "viewer")
    admin = make_user("root", "admin")
    with FakeEngine(name="a", prompt_tokens=3, tokens=4) as engine:
        deploy("dep-lim", "model-lim", [engine.port])
        token, raw = token_for(alice)
        other, other_raw = token_for(alice)
        set_rate_limit(
            actor=Actor(user=admin, name="root"), token_id=token.pk, requests_per_minute=2
        )
        limits_in_force(console_web, admin, "model-lim")
        engine.forget()
        req = {"model": "model-lim", "prompt": "hi", "max_tokens": 4}
        codes = [call(console_web, raw, "/v1/completions", req).status_code for _ in range(2)]
        assert codes == [200, 200]
        refused = call(console_web, raw, "/v1/completions", req)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "requests"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        assert len(engine.requests) == 2  # the refused one never reached the replica
        # another token is not bound by this one's limit
        assert call(console_web, other_raw, "/v1/completions", req).status_code == 200
        usage = counted(token, "model-lim", 3)
        assert (usage.requests, usage.limited, usage.errors) == (3, 1, 0)


@pytest.mark.worker
def test_a_concurrency_limit_holds_while_a_stream_runs(console_web, clean_redis):
    alice = make_user("alice", "viewer")
    admin = make_user("root", "admin")
    with FakeEngine(name="s", tokens=3) as engine:
        deploy("dep-conc", "model-conc", [engine.port])
        token, raw = token_for(alice)
        set_rate_limit(
            actor=Actor(user=admin, name="root"), token_id=None, model="model-conc", concurrent=1
        )
        limits_in_force(console_web, admin, "model-conc")
        engine.hold.clear()  # the stream pauses after its first chunk
        first: dict = {}

        def stream():
            with httpx.stream(
                "POST",
                console_web.url + "/v1/completions",
                json={"model": "model-conc", "prompt": "x", "stream": True},
                headers={"Authorization": f"Bearer {raw}"},
                timeout=30,
            ) as resp:
                first["status"] = resp.status_code
                first["body"] = resp.read()

        t = threading.Thread(target=stream)
        t.start()
        wait_for(lambda: engine.in_flight == 1, 10, message="the stream reached the engine")
        busy = call(console_web, raw, "/v1/completions", {"model": "model-conc", "prompt": "y"})
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "concurrent"
        assert busy.headers["retry-after"] == "1"
        engine.hold.set()
        t.join(30)
        assert first["status"] == 200 and b"[DONE]" in first["body"]
        wait_for(
            lambda: (
                call(
                    console_web, raw, "/v1/completions", {"model": "model-conc", "prompt": "z"}
                ).status_code
                == 200
            ),
            10,
            message="the slot freed after the stream ended",
        )


@pytest.mark.worker
def test_engine_routes_outside_v1_are_relayed_with_auth(console_web, clean_redis):
    alice = make_user("alice", "viewer")
    with FakeEngine(name="t", prompt_tokens=5) as engine:
        deploy("dep-tok", "model-tok", [engine.port])
        _, raw = token_for(alice)
        body = {"model": "model-tok", "prompt": "hello there"}
        assert call(console_web, None, "/tokenize", body).status_code == 401
        ok = call(console_web, raw, "/tokenize", body)
        assert ok.status_code == 200, ok.text
        assert ok.json()["count"] == 5
        assert engine.requests == [] or all(r.get("model") == "model-tok" for r in engine.requests)
        # the engine's control routes are never relayed: Django answers, not the replica
        assert httpx.post(console_web.url + "/sleep", timeout=10).status_code == 404
        assert httpx.post(console_web.url + "/collective_rpc", timeout=10).status_code == 404


def test_limits_api_admin_only_with_clear_422s(client, transactional_db, clean_redis):
    admin = make_user("root", "admin")
    operator = make_user("op", "operator")
    token, _ = token_for(operator)
    client.force_login(operator)
    denied = client.put(
        "/api/v1/gateway/limits",
        {"token_id": token.pk, "requests_per_minute": 5},
        content_type="application/json",
    )
    assert denied.status_code == 403
    client.force_login(admin)
    typo = client.put(
        "/api/v1/gateway/limits",
        {"token_id": token.pk, "requests_per_minut": 5},
        content_type="application/json",
    )
    assert typo.status_code == 422 and typo.json()["field"] == "requests_per_minut"
    zero = client.put("/api/v1/gateway/limits", {"concurrent": 0}, content_type="application/json")
    assert zero.status_code == 422 and zero.json()["field"] == "concurrent"
    empty = client.put("/api/v1/gateway/limits", {"model": "m"}, content_type="application/json")
    assert empty.status_code == 422
    missing = client.put(
        "/api/v1/gateway/limits",
        {"token_id": 999999, "concurrent": 1},
        content_type="application/json",
    )
    assert missing.status_code == 422 and missing.json()["field"] == "token_id"
    ok = client.put(
        "/api/v1/gateway/limits",
        {"token_id": token.pk, "model": "m", "requests_per_minute": 5},
        content_type="application/json",
    )
    assert ok.status_code == 200 and ok.json()["requests_per_minute"] == 5
    again = client.put(
        "/api/v1/gateway/limits",
        {"token_id": token.pk, "model": "m", "concurrent": 3},
        content_type="application/json",
    )
    assert again.json()["id"] == ok.json()["id"]  # replaced, not added
    assert again.json()["requests_per_minute"] is None
    assert RateLimit.objects.count() == 1
    entry = AuditEntry.objects.filter(action="gateway.limit.set").latest("pk")
    assert entry.before["requests_per_minute"] == 5 and entry.after["concurrent"] == 3
    client.force_login(operator)
    assert [r["id"] for r in client.get("/api/v1/gateway/limits").json()] == [ok.json()["id"]]
    client.force_login(admin)
    assert client.delete(f"/api/v1/gateway/limits/{ok.json()['id']}").status_code == 204
    assert not RateLimit.objects.exists()
    assert AuditEntry.objects.filter(action="gateway.limit.delete").exists()


def test_limits_on_the_gateway_page(client, transactional_db, clean_redis):
    admin = make_user("root", "admin")
    viewer = make_user("vi", "viewer")
    token, _ = token_for(viewer)
    client.force_login(admin)
    resp = client.post(
        "/gateway/limits/",
        {"token": token.pk, "model": "", "requests_per_minute": "30", "concurrent": ""},
    )
    assert resp.status_code == 302
    limit = RateLimit.objects.get()
    assert (limit.token_id, limit.requests_per_minute, limit.concurrent) == (token.pk, 30, None)
    bad = client.post("/gateway/limits/", {"token": "", "concurrent": "two"}, follow=True)
    assert "concurrent must be a whole number" in bad.content.decode()
    page = client.get("/gateway/").content.decode()
    assert 'data-testid="limit-form"' in page and ">30<" in page
    client.force_login(viewer)
    page = client.get("/gateway/").content.decode()
    assert 'data-testid="limit-form"' not in page and ">30<" in page
    assert client.post("/gateway/limits/", {"concurrent": "1"}).status_code == 403
