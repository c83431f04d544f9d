"""The gateway's Redis client (console/gateway/redisclient.py): one breaker for every call —
a command, a script, a pipeline — so a Redis that hangs holds one call its timeout and the
next calls on this process for DOWN_S fail at once, without touching the network; an error
Redis answered trips nothing."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from redis.exceptions import ResponseError

from console import embedded_redis
from console.gateway import app, redisclient
from console.gateway.redisclient import RedisDown, Turn, breaker, new_redis
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


@pytest.fixture
def own_redis():
    """A Redis of this test's own: its scripts flushed and its statistics reset without
    touching what other tests run."""
    tmp = Path(tempfile.mkdtemp(prefix="npc-r-"))  # short path: unix sockets max 107 chars
    proc = embedded_redis.start(tmp / "redis.sock", tmp)
    yield f"unix://{tmp / 'redis.sock'}"
    embedded_redis.stop(proc)
    shutil.rmtree(tmp, ignore_errors=True)


INCR_BY = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


def test_a_pipeline_runs_its_scripts_with_no_round_trip_of_their_own(own_redis):
    """redis-py asks SCRIPT EXISTS before every pipeline holding a script; this one does not."""

    async def body():
        r = new_redis(own_redis)
        script = r.register_script(INCR_BY)
        await script(keys=["s"], args=[1])
        await r.config_resetstat()
        pipe = r.pipeline(transaction=False)
        await script(keys=["s"], args=[2], client=pipe)
        pipe.incr("n")
        replies = await pipe.execute()
        stats = await r.info("commandstats")
        await r.aclose()
        return replies, stats

    replies, stats = asyncio.run(body())
    assert replies == [3, 1]
    assert not [name for name in stats if name.startswith("cmdstat_script")]  # EXISTS, LOAD
    assert stats["cmdstat_evalsha"]["calls"] == 1


def test_a_script_redis_lost_is_loaded_and_run_again_alone(own_redis):
    """After SCRIPT FLUSH (or a restart) the script runs once, the pipeline's other commands
    once too (a count is not counted twice), and the replies are in order."""

    async def body():
        r = new_redis(own_redis)
        script = r.register_script(INCR_BY)
        await script(keys=["s"], args=[1])
        await r.script_flush()
        pipe = r.pipeline(transaction=False)
        pipe.incr("n")
        await script(keys=["s"], args=[5], client=pipe)
        pipe.incr("n")
        replies = await pipe.execute()
        values = await r.mget("s", "n")
        await r.aclose()
        return replies, values

    replies, values = asyncio.run(body())
    assert replies == [1, 6, 2]
    assert values == [b"6", b"2"]


def test_a_pipeline_still_raises_what_redis_refused(own_redis):
    async def body():
        r = new_redis(own_redis)
        broken = r.register_script("return redis.call('NO-SUCH-COMMAND')")
        await r.script_flush()
        pipe = r.pipeline(transaction=False)
        pipe.incr("n")
        await broken(client=pipe)
        with pytest.raises(ResponseError, match="Command # 2"):
            await pipe.execute()
        pipe.incr("n")
        await broken(client=pipe)
        replies = await pipe.execute(raise_on_error=False)
        await r.aclose()
        return replies

    replies = asyncio.run(body())
    assert replies[0] == 2 and isinstance(replies[1], ResponseError)


async def _connections(r) -> int:
    return (await r.info("stats"))["total_connections_received"]


async def incr(turn: Turn, key: str) -> int:
    """One caller of `turn`: INCR `key` in its pipeline; the reply (raised when refused)."""
    pipe, replies = turn.join()
    index = len(pipe)
    pipe.incr(key)
    (reply,) = await Turn.replies(replies, range(index, index + 1))
    return reply


def test_calls_made_in_one_turn_of_the_loop_share_one_round_trip(own_redis):
    """Twenty requests' calls at once: one pipeline on one connection (twenty calls alone
    open twenty), each caller its own replies, every script run as if sent alone."""

    async def caller(turn, script, n):
        pipe, replies = turn.join()
        first = len(pipe)
        await script(keys=["s"], args=[n], client=pipe)
        pipe.incr("calls")
        return await Turn.replies(replies, range(first, len(pipe)))

    async def body():
        r = new_redis(own_redis)
        script = r.register_script(INCR_BY)
        await script(keys=["warm"], args=[1])
        before = await _connections(r)
        turn = Turn(r)
        shared = await asyncio.gather(*(caller(turn, script, n) for n in range(1, 21)))
        shared_connections = await _connections(r) - before
        before = await _connections(r)
        await asyncio.gather(*(script(keys=["alone"], args=[n]) for n in range(1, 21)))
        alone_connections = await _connections(r) - before
        await r.aclose()
        return shared, shared_connections, alone_connections

    shared, shared_connections, alone_connections = asyncio.run(body())
    assert shared_connections <= 1 < alone_connections
    running = 0
    for n, (total, calls) in enumerate(shared, start=1):  # in the order they were queued
        running += n
        assert (total, calls) == (running, n)


def test_a_refused_command_raises_for_its_caller_alone(own_redis):
    async def body():
        r = new_redis(own_redis)
        await r.set("text", "not a number")
        turn = Turn(r)
        results = await asyncio.gather(
            incr(turn, "n"), incr(turn, "text"), incr(turn, "n"), return_exceptions=True
        )
        await r.aclose()
        return results

    first, refused, third = asyncio.run(body())
    assert (first, third) == (1, 2)
    assert isinstance(refused, ResponseError)


def test_a_caller_that_goes_away_does_not_take_the_round_trip_with_it(own_redis):
    """A request cancelled after queueing its count (its client left): the count still
    reaches Redis, and the callers beside it get their replies."""

    async def body():
        r = new_redis(own_redis)
        turn = Turn(r)
        leaving = asyncio.create_task(incr(turn, "left"))
        staying = asyncio.create_task(incr(turn, "stayed"))
        await asyncio.sleep(0)  # both queued, the pipeline not yet answered
        leaving.cancel()
        stayed = await staying
        values = await r.mget("left", "stayed")
        await r.aclose()
        return leaving.cancelled(), stayed, values

    cancelled, stayed, values = asyncio.run(body())
    assert cancelled and stayed == 1
    assert values == [b"1", b"1"]


def test_without_redis_every_caller_of_the_turn_gets_the_failure_at_once():
    async def body():
        r = new_redis(f"redis://127.0.0.1:{closed_port()}/0")
        turn = Turn(r)
        began = time.monotonic()
        results = await asyncio.gather(*(incr(turn, "n") for _ in range(5)), return_exceptions=True)
        await r.aclose()
        return results, time.monotonic() - began

    results, took = asyncio.run(body())
    assert all(
        isinstance(x, (ConnectionError, OSError, redisclient.RedisConnectionError)) for x in results
    )
    assert took < 1.0


def test_a_pipeline_left_open_by_a_closed_loop_is_not_joined(own_redis):
    """A loop that stopped before its turn's pipeline was sent (a server shutting down):
    the next loop's callers get a pipeline of their own, not one nobody will send."""
    turn = Turn(new_redis(own_redis))
    old = asyncio.new_event_loop()

    def join_then_stop():
        turn.join()  # its sending task would run on the loop's next turn, which never comes
        old.stop()

    old.call_soon(join_then_stop)
    old.run_forever()

    async def use():
        turn.redis = new_redis(own_redis)
        try:
            return await asyncio.wait_for(incr(turn, "n"), 5)
        finally:
            await turn.redis.aclose()

    try:
        assert asyncio.run(use()) == 1
    finally:
        for task in asyncio.all_tasks(old):
            task.cancel()
        old.run_until_complete(asyncio.sleep(0))
        old.close()
