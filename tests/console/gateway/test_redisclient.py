"""The gateway's Redis client (console/gateway/redisclient.py): one breaker for every call —
a command, a script, a pipeline — so a Redis that hangs holds one call its timeout and the
next calls on this process for DOWN_S fail at once, without touching the network; an error
Redis answered trips nothing."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.exceptions import ResponseError

from console.gateway import app, redisclient
from console.gateway.redisclient import RedisDown, breaker, new_redis
from tests.kit import closed_port, silent_server


def timed(coro_fn):
    async def run():
        began = time.monotonic()
        try:
            await coro_fn()
        except Exception as exc:
            return exc, time.monotonic() - began
        return None, time.monotonic() - began

    return run()


def test_a_hung_redis_holds_one_call_then_every_kind_of_call_fails_at_once():
    async def body():
        with silent_server() as port:
            r = new_redis(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
            first = await timed(r.ping)
            script = r.register_script("return 1")
            pipe = r.pipeline(transaction=False)
            pipe.incr("npc:gw:test")
            after = [await timed(r.ping), await timed(script), await timed(pipe.execute)]
            await r.aclose()
            return first, after

    (exc, took), after = asyncio.run(body())
    assert not isinstance(exc, RedisDown) and 0.3 <= took < 1.0  # one timeout, no retry of it
    for exc, took in after:
        assert isinstance(exc, RedisDown) and took < 0.05


def test_a_refused_connection_trips_it_too():
    async def body():
        r = new_redis(f"redis://127.0.0.1:{closed_port()}/0")
        results = [await timed(r.ping) for _ in range(3)]
        await r.aclose()
        return results

    results = asyncio.run(body())
    assert not isinstance(results[0][0], RedisDown)
    assert all(isinstance(exc, RedisDown) for exc, _ in results[1:])


def test_after_down_s_redis_is_asked_again_and_a_live_one_answers(redis_url):
    breaker.trip()

    async def body():
        r = new_redis(redis_url)
        refused = await timed(r.ping)
        breaker.down_until = time.monotonic() - 0.001  # DOWN_S has passed
        answer = await r.ping()
        await r.aclose()
        return refused, answer

    (exc, _), answer = asyncio.run(body())
    assert isinstance(exc, RedisDown) and answer is True


def test_an_error_redis_answered_trips_nothing(redis_url):
    """A wrong command, a script error: Redis is there, the next call must reach it."""

    async def body():
        r = new_redis(redis_url)
        with pytest.raises(ResponseError):
            await r.execute_command("NO-SUCH-COMMAND")
        with pytest.raises(ResponseError):
            await r.register_script("return redis.call('NO-SUCH-COMMAND')")()
        answer = await r.ping()
        await r.aclose()
        return answer

    assert asyncio.run(body()) is True
    assert breaker.down_until == 0.0


def test_the_gateway_uses_this_client(settings, redis_url):
    settings.REDIS_URL = redis_url

    async def body():
        return app.redis_client()

    assert isinstance(asyncio.run(body()), redisclient.BreakerRedis)
