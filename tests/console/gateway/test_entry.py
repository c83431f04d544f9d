"""A request's way in (console/gateway/entry.py): admission and pick in one Redis round trip,
deciding what limits.Limiter.admit and routing.Router.pick decide in a row — exact limits
across processes, nothing counted in flight for a refused request, a changed limit read
again at once, serving on without Redis — and the tables read again off the request path."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from console.gateway import auth, entry, limits, redisclient, routing
from console.gateway.entry import admit_and_pick
from console.gateway.limits import Admission, Limiter, Refusal, Table
from console.gateway.redisclient import Turn, new_redis
from console.gateway.routing import Overloaded, Router
from tests.console.gateway.test_limits import row
from tests.console.gateway.test_shared_routing import run, ups
from tests.kit import closed_port, silent_server


def limiter(rows: dict, version: str = "0") -> Limiter:
    lim = Limiter()
    lim.table = Table(at=time.monotonic(), rows=rows, version=version)
    return lim


def router_for(upstreams) -> Router:
    router = Router()
    router.table = routing.Table(at=float("inf"), by_model={"m": upstreams})
    return router


def test_limits_are_exact_and_refused_requests_hold_no_replica(redis_url, clean_redis):
    """Two processes, 40 requests at once, 6 requests/min: exactly 6 let in and counted in
    flight on the replicas, the other 34 refused and counted nowhere."""
    upstreams = ups(2)
    procs = [(limiter({(1, ""): row(rpm=6)}), router_for(upstreams)) for _ in range(2)]

    async def body(r):
        turns = [Turn(r), Turn(r)]  # each process's requests share its round trips
        return await asyncio.gather(
            *(
                admit_and_pick(
                    turns[i % 2], *procs[i % 2], "m", upstreams, token_id=1, affinity=None
                )
                for i in range(40)
            )
        )

    results = run(redis_url, body)
    refused = [x for x in results if isinstance(x, Refusal)]
    entered = [x for x in results if not isinstance(x, Refusal)]
    assert len(entered) == 6 and len(refused) == 34
    assert all(isinstance(adm, Admission) and adm.limits for adm, _, _ in entered)
    in_flight = sum(clean_redis.zcard(routing.INFLIGHT + str(u.replica_id)) for u in upstreams)
    assert in_flight == 6
    assert Counter(order[0].replica_id for _, order, _ in entered) == {100: 3, 101: 3}


def test_a_concurrency_slot_and_the_in_flight_count_end_together(redis_url, clean_redis):
    upstreams = ups(1)
    lim, router = limiter({(1, ""): row(conc=1)}), router_for(upstreams)

    async def body(r):
        first = await admit_and_pick(
            Turn(r), lim, router, "m", upstreams, token_id=1, affinity=None
        )
        second = await admit_and_pick(
            Turn(r), lim, router, "m", upstreams, token_id=1, affinity=None
        )
        admission, _, lease = first
        pipe = r.pipeline(transaction=False)
        await router.done_into(r, pipe, lease)
        lim.release_into(pipe, admission, tokens=5)
        await pipe.execute()
        third = await admit_and_pick(
            Turn(r), lim, router, "m", upstreams, token_id=1, affinity=None
        )
        return second, third

    second, third = run(redis_url, body)
    assert isinstance(second, Refusal) and second.what == "concurrent"
    assert not isinstance(third, Refusal)
    assert clean_redis.zcard(routing.INFLIGHT + "100") == 1  # the third, alone


def test_a_changed_limit_binds_the_next_request(redis_url, clean_redis, gateway_db_thread):
    """This process holds an old table (version 0, no limit); a limit set elsewhere bumped
    the version: the script says stale, the table is read again, the new limit binds."""
    from console.accounts.services import Actor
    from console.gateway.services import set_rate_limit
    from tests.helpers import make_user

    admin = make_user("root", "admin")
    set_rate_limit(
        actor=Actor(user=admin, name="root"), token_id=None, model="m", requests_per_minute=1
    )
    upstreams = ups(1)
    lim, router = limiter({}, version="stale"), router_for(upstreams)
    lim.table = Table(at=time.monotonic() - 5, rows={}, version="stale")  # past EMPTY_TRUST_S

    async def body(r):
        a = await admit_and_pick(Turn(r), lim, router, "m", upstreams, token_id=1, affinity=None)
        b = await admit_and_pick(Turn(r), lim, router, "m", upstreams, token_id=1, affinity=None)
        return a, b

    a, b = run(redis_url, body)
    assert not isinstance(a, Refusal) and a[0].limits
    assert isinstance(b, Refusal) and b.limit.scope == "model 'm'"


def test_overloaded_still_returns_the_admission_to_end(redis_url, clean_redis):
    upstreams = ups(2, capacity=4, loads=[8.0, 9.0])
    lim, router = limiter({(1, ""): row(conc=3)}), router_for(upstreams)

    async def body(r):
        return await admit_and_pick(Turn(r), lim, router, "m", upstreams, token_id=1, affinity=None)

    admission, why = run(redis_url, body)
    assert isinstance(why, Overloaded) and why.kind == "shed"
    assert admission.holds_slots  # counted: the caller's count() frees it


def test_without_redis_it_serves_unlimited_on_this_process_alone_at_once(caplog):
    """With the gateway's own client (this test built a redis-py client with the
    constructor's default, ten retries with backoff, and its three requests took 12 s)."""
    upstreams = ups(2)
    lim, router = limiter({(1, ""): row(rpm=1)}), router_for(upstreams)

    async def body():
        dead = new_redis(f"redis://127.0.0.1:{closed_port()}/0")
        try:
            return [
                await admit_and_pick(
                    Turn(dead), lim, router, "m", upstreams, token_id=1, affinity=None
                )
                for _ in range(3)
            ]
        finally:
            await dead.aclose()

    started = time.monotonic()
    results = asyncio.run(body())
    assert time.monotonic() - started < 1.0
    assert all(not isinstance(x, Refusal) for x in results)
    assert all(adm.limits == () and not lease.shared for adm, _, lease in results)
    assert router.inflight.total() == 3


def test_after_redis_hung_on_a_request_the_next_ones_skip_it_for_a_second():
    """A Redis that hangs instead of refusing (a lost network, a stopped process) costs one
    request its reply timeout, not every request: for the breaker's DOWN_S the others are
    served without asking it, then it is asked again."""
    upstreams = ups(2)
    lim, router = limiter({(1, ""): row(rpm=1)}), router_for(upstreams)

    async def serve(n):
        with silent_server() as port:
            hung = new_redis(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
            took = []
            for _ in range(n):
                began = time.monotonic()
                result = await admit_and_pick(
                    Turn(hung), lim, router, "m", upstreams, token_id=1, affinity=None
                )
                took.append(time.monotonic() - began)
                assert not isinstance(result, Refusal) and not result[2].shared
            await hung.aclose()
            return took

    took = asyncio.run(serve(5))
    assert took[0] >= 0.3 and max(took[1:]) < 0.1
    redisclient.breaker.down_until = time.monotonic() - 0.001  # DOWN_S has passed
    assert asyncio.run(serve(1))[0] >= 0.3  # asked again


def test_the_combined_script_wraps_the_two_scripts_unchanged():
    """The combined path must decide what the two scripts decide: it runs their very text."""
    assert limits.ADMIT in entry.ADMIT_AND_PICK and routing.PICK in entry.ADMIT_AND_PICK


def test_a_stale_routing_table_is_read_again_in_the_background(monkeypatch, gateway_db_thread):
    """A request that finds the table stale is routed on it at once; one background read
    brings the next; past STALE_S the request waits for the read."""
    reads = []

    def read_table():
        reads.append(time.monotonic())
        time.sleep(1.0)  # long beside the bound below: a request that waited shows
        return routing.Table(at=time.monotonic(), by_model={"m": ups(len(reads) + 1)})

    monkeypatch.setattr(routing, "_read_table", read_table)

    async def body():
        router = Router()
        router.table = routing.Table(
            at=time.monotonic() - routing.REFRESH_S - 0.1, by_model={"m": ups(1)}
        )
        start = time.monotonic()
        first = [await router.refresh() for _ in range(5)]
        took = time.monotonic() - start
        deadline = time.monotonic() + 5
        while len(router.table.by_model["m"]) == 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        fresh = router.table
        router.table = routing.Table(
            at=time.monotonic() - routing.STALE_S - 1, by_model={"m": ups(1)}
        )
        waited = await router.refresh()
        return first, took, fresh, waited

    first, took, fresh, waited = asyncio.run(body())
    assert all(len(t.by_model["m"]) == 1 for t in first) and took < 0.8  # none waited
    assert len(fresh.by_model["m"]) == 2  # the one background read
    assert len(waited.by_model["m"]) == 3 and len(reads) == 2  # the second read, waited for


def test_a_steady_client_never_waits_and_a_revoked_token_stops_within_cache_s(
    monkeypatch, gateway_db_thread
):
    from console.accounts.models import ApiToken
    from console.accounts.services import Actor, create_token
    from tests.helpers import make_user

    auth.forget()
    monkeypatch.setattr(auth, "CACHE_S", 0.6)
    user = make_user("carol", "viewer")
    token, raw = create_token(actor=Actor(user=user, name="carol"), name="t")
    header = f"Bearer {raw}"

    async def body():
        assert await auth.authenticate(header) is not None
        await asyncio.sleep(0.35)  # into the second half of the entry's life
        assert await auth.authenticate(header) is not None  # answered from the cache...
        deadline = time.monotonic() + 5
        while auth._refreshing and time.monotonic() < deadline:  # ...and read again behind
            await asyncio.sleep(0.01)
        renewed = auth._cache[auth.hash_token(raw)][0] - time.monotonic()
        await asyncio.to_thread(ApiToken.objects.filter(pk=token.pk).delete)
        start = time.monotonic()
        while await auth.authenticate(header) is not None:
            assert time.monotonic() - start < 0.6 + 0.5, "revoked token still accepted"
            await asyncio.sleep(0.02)
        return renewed

    assert asyncio.run(body()) > 0.4  # the background read pushed the expiry forward
    auth.forget()
