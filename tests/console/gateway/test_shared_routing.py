"""Routing shared by every console process (console/gateway/routing.py): in-flight counts in
Redis, prefix affinity, fair share between tokens when every replica is full, load shedding
past SHED_FACTOR, leases that end with a dead process, and the fallback without Redis."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import httpx
import pytest
from redis import asyncio as aioredis

from console.deployments.engines import metrics_key
from console.gateway import routing
from console.gateway.routing import Overloaded, Router, Upstream, affine, affinity_key
from tests.console.gateway.test_gateway import call, deploy, token_for
from tests.helpers import make_user
from tests.kit import FakeEngine, wait_for


def ups(n: int, *, capacity: int = 256, loads=None) -> list[Upstream]:
    loads = loads or [0.0] * n
    return [
        Upstream(100 + i, f"d/{i}", f"http://127.0.0.1:{9000 + i}", loads[i], "", capacity)
        for i in range(n)
    ]


def run(redis_url: str, body):
    async def main():
        r = aioredis.Redis.from_url(redis_url)
        try:
            return await body(r)
        finally:
            await r.aclose()

    return asyncio.run(main())


def test_two_processes_share_their_in_flight_counts(redis_url, clean_redis):
    """Two routers (two console processes) picking at once for two idle replicas: least loaded
    counts both processes' requests, so the 20 requests split 10 / 10, not 20 / 0."""
    a, b = Router(), Router()
    upstreams = ups(2)

    async def body(r):
        picks = await asyncio.gather(
            *((a if i % 2 else b).pick(r, "m", upstreams, token_id=i) for i in range(20))
        )
        return Counter(order[0].replica_id for order, _ in picks), picks

    counts, picks = run(redis_url, body)
    assert counts == {100: 10, 101: 10}
    assert clean_redis.zcard(routing.INFLIGHT + "100") == 10

    async def finish(r):
        for router, (_, lease) in zip([b, a] * 10, picks, strict=True):
            await router.done(r, lease)

    run(redis_url, finish)
    assert clean_redis.zcard(routing.INFLIGHT + "100") == 0
    assert not clean_redis.exists(routing.ACTIVE + routing.model_key("m"))


def test_idle_replicas_take_turns_on_the_request_path(redis_url, clean_redis):
    """One request at a time (nothing in flight, no load): ties go round-robin as the
    gateway calls the router — candidates(), then pick(), then done() — over 2 and 3
    replicas. (Both calls once stepped one counter: with 2 replicas every tie went to the
    same one.)"""
    for n in (2, 3):
        router = Router()
        upstreams = ups(n)
        router.table = routing.Table(at=float("inf"), by_model={"m": upstreams})

        async def body(r, router=router):
            seen = []
            for _ in range(2 * n):
                candidates = await router.candidates("m")
                order, lease = await router.pick(r, "m", candidates, token_id=1)
                seen.append(order[0].replica_id)
                await router.done(r, lease)
            return seen

        seen = run(redis_url, body)
        assert Counter(seen) == {up.replica_id: 2 for up in upstreams}, seen


def test_a_shared_prefix_stays_on_one_replica_until_it_is_busier(redis_url, clean_redis):
    router = Router()
    upstreams = ups(3)
    key = affinity_key(
        {},
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "system", "content": "You are a careful assistant. " * 20},
                {"role": "user", "content": "question 1"},
            ]
        },
    )
    home = upstreams[affine(key, upstreams)].replica_id

    async def body(r):
        seen = []
        for _ in range(routing.AFFINITY_SLACK + 1):
            order, _ = await router.pick(r, "m", upstreams, token_id=1, affinity=key)
            seen.append(order[0].replica_id)
        # now `home` holds AFFINITY_SLACK + 1 more than the others: the next one goes elsewhere
        order, _ = await router.pick(r, "m", upstreams, token_id=1, affinity=key)
        return seen, order[0].replica_id

    seen, spilled = run(redis_url, body)
    assert seen == [home] * (routing.AFFINITY_SLACK + 1)
    assert spilled != home


def test_affinity_keys():
    long = "You are a careful assistant. " * 20
    chat = {"messages": [{"role": "user", "content": "q1"}, {"role": "system", "content": long}]}
    other = {"messages": [{"role": "system", "content": long}, {"role": "user", "content": "q2"}]}
    path = "/v1/chat/completions"
    assert affinity_key({}, path, chat) == affinity_key({}, path, other)  # system prompt first
    assert affinity_key({"x-session-id": "abc"}, path, chat) == "s:abc"
    assert affinity_key({"x-npc-affinity": "off", "x-session-id": "abc"}, path, chat) is None
    assert affinity_key({}, "/v1/completions", {"prompt": "short"}) is None
    assert affinity_key({}, "/v1/completions", {"prompt": long + "x"}) == affinity_key(
        {}, "/v1/completions", {"prompt": long + "y"}
    )
    assert affinity_key({}, "/v1/completions", {"prompt": [1, 2, 3]}) is None
    # rendezvous: removing a replica moves only the keys that preferred it
    keys = [f"p:{i}" for i in range(200)]
    three, two = ups(3), ups(3)[:2]
    moved = [
        k for k in keys if three[affine(k, three)].replica_id != two[affine(k, two)].replica_id
    ]
    assert all(three[affine(k, three)].replica_id == 102 for k in moved)


def test_fair_share_when_every_replica_is_full(redis_url, clean_redis):
    """Capacity 4 in all. Token 1 fills it; token 2 still gets in (its share is 2); token 1,
    holding more than its share while the replicas are full, is refused until one ends."""
    router = Router()
    upstreams = ups(2, capacity=2)

    async def body(r):
        heavy = [await router.pick(r, "m", upstreams, token_id=1) for _ in range(4)]
        assert all(not isinstance(p, Overloaded) for p in heavy)
        light = await router.pick(r, "m", upstreams, token_id=2)
        refused = await router.pick(r, "m", upstreams, token_id=1)
        await router.done(r, heavy[0][1])
        await router.done(r, heavy[1][1])
        await router.done(r, heavy[2][1])
        again = await router.pick(r, "m", upstreams, token_id=1)
        return light, refused, again

    light, refused, again = run(redis_url, body)
    assert not isinstance(light, Overloaded)
    assert refused == Overloaded("fair_share", 2)
    assert not isinstance(again, Overloaded)


def test_load_is_shed_past_twice_the_capacity_of_every_replica(redis_url, clean_redis):
    router = Router()

    async def body(r):
        shed = await router.pick(r, "m", ups(2, capacity=4, loads=[8.0, 9.0]), token_id=1)
        one_left = await router.pick(r, "m", ups(2, capacity=4, loads=[8.0, 7.0]), token_id=1)
        return shed, one_left

    shed, one_left = run(redis_url, body)
    assert shed == Overloaded("shed")
    assert one_left[0][0].replica_id == 101


def test_a_dead_process_frees_its_requests_when_the_lease_ends(redis_url, clean_redis, monkeypatch):
    monkeypatch.setattr(routing, "LEASE_S", 0.3)
    router = Router()
    upstreams = ups(2)
    key = routing.INFLIGHT + "100"

    async def body(r):
        for _ in range(3):  # never done: the process "died"
            await router.pick(r, "m", upstreams[:1], token_id=1)
        held = await r.zcard(key)
        order, lease = await router.pick(r, "m", upstreams, token_id=2)
        await router.done(r, lease)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while loop.time() < deadline:
            _, probe = await router.pick(r, "m", upstreams, token_id=2)
            await router.done(r, probe)
            if await r.zcard(key) == 0:
                return held, order[0].replica_id, True
            await asyncio.sleep(0.05)
        return held, order[0].replica_id, False

    held, busy_pick, freed = run(redis_url, body)
    assert held == 3 and busy_pick == 101  # 100 held three
    assert freed, "the dead process's requests were never swept"


def test_without_redis_routing_falls_back_to_this_process(caplog):
    router = Router()
    upstreams = ups(2)
    router.table = routing.Table(at=float("inf"), by_model={"m": upstreams})

    async def body():
        r = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
        try:
            order, lease = await router.pick(r, "m", upstreams, token_id=1)
            await router.done(r, lease)
            return order, lease
        finally:
            await r.aclose()

    order, lease = asyncio.run(body())
    assert len(order) == 2 and not lease.shared
    assert router.inflight == Counter()
    assert "in-flight counts not shared" in caplog.text


@pytest.mark.worker
def test_the_gateway_sheds_and_shares_in_flight_counts(console_web, clean_redis):
    alice = make_user("alice", "viewer")
    _, raw = token_for(alice)
    with FakeEngine(name="a") as a, FakeEngine(name="b") as b:
        ra, rb = deploy("dep-shed", "model-shed", [a.port, b.port])
        ra.deployment.max_num_seqs = 2
        ra.deployment.save(update_fields=["max_num_seqs"])
        # another console process has 3 requests in flight on replica a
        for i in range(3):
            clean_redis.zadd(routing.INFLIGHT + str(ra.pk), {f"other-{i}": 4102444800})
        req = {"model": "model-shed", "prompt": "x", "max_tokens": 1}
        for _ in range(3):
            assert call(console_web, raw, "/v1/completions", req).status_code == 200
        assert len(b.requests) == 3 and a.requests == []  # a is busy in another process
        for replica in (ra, rb):
            clean_redis.set(
                metrics_key(replica.pk),
                json.dumps({"num_requests_running": 2, "num_requests_waiting": 3}),
            )

        def shed():
            resp = httpx.post(
                console_web.url + "/v1/completions",
                json=req,
                headers={"Authorization": f"Bearer {raw}"},
                timeout=10,
            )
            return resp if resp.status_code == 503 else None

        resp = wait_for(shed, 10, message="the gateway sheds once the scrape shows overload")
        assert resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "overloaded"
