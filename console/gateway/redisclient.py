"""The gateway's Redis client, with one breaker for every call it makes.

Serving outranks limiting and sharing: every gateway call to Redis (a request's admission and
pick, the count after the response, a stream's lease renewals, failover's move) already falls
back to this process's own counts when Redis fails. What a failing Redis must not do is hold
each of those calls for its timeout: a Redis that hangs (a lost network, a stopped process)
answers nothing, and every call would wait `socket_timeout` before falling back. So the
client trips a breaker when a call fails for want of Redis (a connection refused, lost or
timed out); for DOWN_S after that, every call on this process raises RedisDown at once,
without touching the network; the first call after DOWN_S tries Redis again. An error Redis
answered (a script error, a wrong type) says nothing about its health and trips nothing.

The breaker is per process, like the fallback counts it protects.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis import asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

DOWN_S = 1.0  # after Redis failed a call, this process goes on without it this long
# The gateway's scripts and pipelines take well under a millisecond; a reply a second late is
# a Redis that hangs (the first call to find it so waits this long, then the breaker opens).
SOCKET_TIMEOUT_S = 1.0

# A failure that means Redis is not there: redis-py's own, and what a socket or an asyncio
# timeout raises beneath it (OSError: ConnectionError and TimeoutError are among its kinds).
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)


class RedisDown(RedisConnectionError):
    """Redis failed a call less than DOWN_S ago: this one is not held trying it again."""


class Breaker:
    """Open for DOWN_S after a call found Redis unreachable."""

    def __init__(self, down_s: float = DOWN_S) -> None:
        self.down_s = down_s
        self.down_until = 0.0  # time.monotonic() before which no call tries Redis

    def check(self) -> None:
        """Raise RedisDown while the breaker is open."""
        if time.monotonic() < self.down_until:
            raise RedisDown(f"Redis failed a call less than {self.down_s:g} s ago")

    def trip(self) -> None:
        self.down_until = time.monotonic() + self.down_s

    def reset(self) -> None:
        self.down_until = 0.0

    async def call(self, run: Any, *args: Any, **kwargs: Any) -> Any:
        self.check()
        try:
            return await run(*args, **kwargs)
        except UNREACHABLE:
            self.trip()
            raise


breaker = Breaker()


class BreakerPipeline(Pipeline):
    """A pipeline whose round trip goes through the breaker (queuing a command does not), and
    whose scripts cost no round trip of their own.

    redis-py asks Redis `SCRIPT EXISTS` before every pipeline that holds a script: a round
    trip of its own each time, one in three of a gateway request's (the count after the
    answer ends its lease with a script). Here a pipeline without MULTI sends its EVALSHAs as
    they are; only when Redis answers NOSCRIPT (it restarted, or its scripts were flushed) are
    the scripts loaded and those commands run again, alone — the pipeline's other commands
    ran once, as they must (a count is not counted twice)."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        if self.is_transaction or self.explicit_transaction or not self.scripts:
            return await breaker.call(super().execute, raise_on_error)
        stack, scripts = list(self.command_stack), list(self.scripts)
        self.scripts = set()  # redis-py's execute loads scripts only when it holds some
        replies = await breaker.call(super().execute, False)
        lost = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if lost:
            await self._again(stack, scripts, replies, lost)
        if raise_on_error:
            self.raise_first_error(stack, replies)
        return replies

    async def _again(self, stack, scripts, replies: list[Any], lost: list[int]) -> None:
        """Load the scripts Redis lost and run the commands it refused for that again."""
        redis = BreakerRedis(connection_pool=self.connection_pool)
        for script in scripts:
            script.sha = await redis.script_load(script.script)
        for i in lost:
            args, options = stack[i]
            try:
                replies[i] = await redis.execute_command(*args, **options)
            except ResponseError as exc:
                replies[i] = exc


class BreakerRedis(aioredis.Redis):
    """redis.asyncio.Redis whose every command and pipeline goes through the breaker.

    Scripts too: a registered script's call is an EVALSHA command (and a SCRIPT LOAD when
    Redis lost it), both through execute_command."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        return await breaker.call(super().execute_command, *args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        return BreakerPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )


def new_redis(url: str, *, socket_timeout: float = SOCKET_TIMEOUT_S) -> BreakerRedis:
    """The gateway's Redis client: a connect that gives up after 0.5 s, a reply after
    SOCKET_TIMEOUT_S, one immediate retry when a pooled connection was lost (Redis restarted)
    but none after a timeout (a Redis that hangs would hold the call twice), never a backoff,
    and the breaker: serving goes on at once without Redis."""
    return BreakerRedis.from_url(
        url,
        socket_timeout=socket_timeout,
        socket_connect_timeout=0.5,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )


class Turn:
    """The Redis calls of many requests made in one turn of the event loop, sent in one
    pipeline: one round trip instead of one each.

    Under load answers arrive in bursts (an engine finishes a batch's requests in the same
    step), and each request's admission before it is sent and its count after it ends were a
    round trip of their own — a write, a wake of Redis, a read, on the CPU the gateway shares
    with it. A caller queues its commands on `join()`'s pipeline (queuing sends nothing) and
    awaits `replies()`; the pipeline is sent by a task of its own on the loop's next turn, with
    every command queued until then. Each command still runs alone and in order in Redis (a
    script atomically, as if sent by itself); an error Redis answered is its caller's alone.
    A caller queues without suspending between `join()` and its last command (redis-py's
    pipeline queues at once, a script call on it too), so its commands sit together in the
    pipeline it joined.
    One instance per event loop (a pipeline's connection pool belongs to one loop)."""

    def __init__(self, redis: BreakerRedis) -> None:
        self.redis = redis
        self._open: tuple[Pipeline, asyncio.Future] | None = None
        self._sending: set[asyncio.Task] = set()

    def join(self) -> tuple[Pipeline, asyncio.Future]:
        """This turn's pipeline, and the future of its replies (for `replies`)."""
        loop = asyncio.get_running_loop()
        # a pipeline left open by a loop that closed before sending it is dropped, not joined
        if self._open is None or self._open[1].get_loop() is not loop:
            self._open = (self.redis.pipeline(transaction=False), loop.create_future())
            task = loop.create_task(self._send())
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        return self._open

    async def _send(self) -> None:
        pipe, replies = self._open
        self._open = None
        try:
            replies.set_result(await pipe.execute(raise_on_error=False))
        except asyncio.CancelledError:  # the loop is closing
            replies.cancel()
            raise
        except Exception as exc:  # every caller raises it (Redis down, the breaker open)
            replies.set_exception(exc)
            replies.exception()  # retrieved here: its callers may all have gone

    @staticmethod
    async def replies(replies: asyncio.Future, queued: range) -> list[Any]:
        """The replies to the commands a caller queued (`queued`: their places in the
        pipeline); the first that is an error is raised. The pipeline is sent whatever
        becomes of its callers (shielded from their cancel)."""
        result = await asyncio.shield(replies)
        mine = [result[i] for i in queued]
        for reply in mine:
            if isinstance(reply, Exception):
                raise reply
        return mine
