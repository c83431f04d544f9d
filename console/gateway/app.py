"""The gateway: `/v1/models`, `/v1/chat/completions` and `/v1/completions` on the console,
forwarded to a ready replica of the named model.

It is a small Starlette app mounted beside Django in console/asgi.py rather than a Django
view: Django's synchronous middleware would put a thread hop on every request and every
streamed chunk, and the promise here is < 5 % added latency (bench/gateway_overhead.py).
Streaming responses are relayed event by event as they arrive (nothing is buffered beyond
one server-sent event); when the client goes away the upstream request is closed, which
makes vLLM abort it. A replica that refuses the connection, or answers 502/503 before any
byte was sent to the client, is retried on the next one. Replicas on simulated nodes are
never upstreams (routing.py): a model served only there is a 503 that says so. Errors use
OpenAI's error shape so OpenAI clients show them as such.

Upstream requests go through aiohttp, not httpx: measured with bench/gateway_overhead.py's
set-up against a stand-in upstream, httpx's async client cost ~2 ms of Python per request of
the ~4.5 ms the gateway added (aiohttp: ~2.8 ms added in all), the largest share of the
overhead. httpx stays for the console's synchronous calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

import aiohttp
import anyio
import orjson
from redis import asyncio as aioredis
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import usage
from .auth import Principal, authenticate
from .entry import admit_and_pick
from .limits import Admission, Limiter, Refusal
from .redisclient import Turn, new_redis
from .routing import Lease, Overloaded, Router, Upstream, affinity_key

log = logging.getLogger("console.gateway")

# The client's own Authorization (its console token) is never forwarded: only these headers
# are, and each upstream request carries the replica's engine key instead (_upstream_headers).
MAX_BODY = 8 * 1024 * 1024
# What a replica may send back (its host may be compromised: it must harm only its own model's
# users, never the console): a whole answer is read into memory only up to MAX_ANSWER (an
# embeddings answer of a large batch is tens of MB), one server-sent event only up to
# MAX_EVENT; over either the request ends as a failure of that replica (502, or the stream
# cut). Answers are never decompressed: the engine is asked for identity encoding.
MAX_ANSWER = 256 * 1024 * 1024
MAX_EVENT = 4 * 1024 * 1024
MAX_TRIES = 3
RETRY_STATUS = {502, 503}
# no total: a stream lasts as long as it generates; a connect over 3 s tries the next replica
TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=3.0, sock_read=600.0)
# failures before any answer from the replica: the request is tried on the next one
REFUSED = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
)
FORWARD_HEADERS = ("content-type", "accept", "x-request-id")
# the routes whose streams end with a usage chunk when asked (stream_options.include_usage)
USAGE_CHUNK_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})

router = Router()
limiter = Limiter()
_clients: dict[int, aiohttp.ClientSession] = {}
_turns: dict[int, Turn] = {}  # per loop; each holds the loop's Redis client


def _loop_key() -> int:
    return id(asyncio.get_running_loop())


def client() -> aiohttp.ClientSession:
    """One pooled session per event loop (keep-alive connections to the replicas). It reads
    no proxy settings from the environment: replicas are reached directly."""
    key = _loop_key()
    c = _clients.get(key)
    if c is None or c.closed:
        c = _clients[key] = aiohttp.ClientSession(
            timeout=TIMEOUT,
            connector=aiohttp.TCPConnector(limit=1000, limit_per_host=0),
            trust_env=False,
            auto_decompress=False,
        )
    return c


def redis_turn() -> Turn:
    """This loop's shared pipeline: the Redis calls of a turn of the loop in one round trip."""
    from django.conf import settings

    key = _loop_key()
    t = _turns.get(key)
    if t is None:
        t = _turns[key] = Turn(new_redis(settings.REDIS_URL))
    return t


def redis_client() -> aioredis.Redis:
    """This loop's Redis client (the one its shared pipeline uses)."""
    return redis_turn().redis


_pending: set[asyncio.Task] = set()


def _background(coro) -> None:
    """Run `coro` after the response, keeping a reference until it is done."""
    task = asyncio.get_running_loop().create_task(coro)
    _pending.add(task)
    task.add_done_callback(_pending.discard)


def _count_failure(principal: Principal, model: str, admission: Admission, lease: Lease) -> None:
    """End a failed admitted request: its admission and lease released, counted not ok."""
    _background(
        count(principal, model, ok=False, body_usage=None, admission=admission, lease=lease)
    )


def error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None):
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": code}},
        status_code=status,
    )


async def _principal(request: Request) -> Principal | JSONResponse:
    principal = await authenticate(request.headers.get("authorization"))
    if principal is None:
        return error(
            401,
            "a valid console API token is required: Authorization: Bearer npc_…",
            "authentication_error",
            code="invalid_api_key",
        )
    return principal


def _tokens(body_usage: dict | None) -> tuple[int, int]:
    u = body_usage if isinstance(body_usage, dict) else {}
    out = []
    for key in ("prompt_tokens", "completion_tokens"):
        try:
            out.append(max(0, int(u.get(key) or 0)))
        except (TypeError, ValueError):
            out.append(0)
    return out[0], out[1]


async def count(
    principal: Principal,
    model: str,
    *,
    ok: bool,
    body_usage: dict | None,
    admission: Admission | None = None,
    lease: Lease | None = None,
    limited: bool = False,
) -> None:
    """Count a request in the usage hash and end it: its admission (slots, tokens per
    minute) and its lease (in flight on a replica). Its commands go in the loop's shared
    pipeline (`redis_turn`): one round trip for every request ended in the same turn."""
    prompt, completion = _tokens(body_usage)
    fields = usage.fields_for(
        principal.token_id, model, ok=ok, prompt=prompt, completion=completion, limited=limited
    )
    turn = redis_turn()
    try:
        pipe, replies = turn.join()
        first = len(pipe)
        if lease is not None:
            await router.done_into(turn.redis, pipe, lease)
        if admission is not None:
            limiter.release_into(pipe, admission, prompt + completion)
        for f, n in fields.items():
            pipe.hincrby(usage.KEY, f, n)
        await Turn.replies(replies, range(first, len(pipe)))
    except Exception as exc:  # counting must never break serving
        log.warning("request not counted (usage, limits, in-flight): %s", exc)


async def models(request: Request) -> Response:
    principal = await _principal(request)
    if not isinstance(principal, Principal):
        return principal
    table = await router.refresh()
    data = [
        {"id": name, "object": "model", "owned_by": "npu-console", "replicas": len(ups)}
        for name, ups in sorted(table.by_model.items())
        if principal.may_use(name)
    ]
    return JSONResponse({"object": "list", "data": data})


async def _read_json(request: Request) -> dict | JSONResponse:
    size = request.headers.get("content-length")
    if size and size.isdigit() and int(size) > MAX_BODY:
        return error(413, f"request body over {MAX_BODY} bytes", "invalid_request_error")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return error(413, f"request body over {MAX_BODY} bytes", "invalid_request_error")
    try:
        payload = orjson.loads(body)
    except (ValueError, UnicodeDecodeError):
        return error(400, "the body must be a JSON object", "invalid_request_error")
    if not isinstance(payload, dict):
        return error(400, "the body must be a JSON object", "invalid_request_error")
    return payload


async def forward(request: Request) -> Response:
    principal = await _principal(request)
    if not isinstance(principal, Principal):
        return principal
    payload = await _read_json(request)
    if not isinstance(payload, dict):
        return payload
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return error(
            400, "`model` is required: a served model name", "invalid_request_error", "model"
        )
    if not principal.may_use(model):
        return error(
            403,
            f"this token may not use model {model!r}",
            "permission_error",
            "model",
            "model_not_allowed",
        )
    upstreams = await router.candidates(model)
    if not upstreams:
        table = router.table
        if model not in table.known_models:
            return error(
                404,
                f"no deployment serves model {model!r}",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        if model in table.simulated_only:
            return error(
                503,
                f"the ready replicas of {model!r} are on SIMULATED nodes (make demo): their "
                "engines are simulated, no server answers there",
                "service_unavailable",
                "model",
                "simulated_replicas_only",
            )
        return error(503, f"no replica of {model!r} is ready", "service_unavailable")

    entered = await admit_and_pick(
        redis_turn(),
        limiter,
        router,
        model,
        upstreams,
        token_id=principal.token_id,
        affinity=affinity_key(request.headers, request.url.path, payload),
    )
    if isinstance(entered, Refusal):
        _background(count(principal, model, ok=False, body_usage=None, limited=True))
        response = error(429, entered.message, entered.what, None, "rate_limit_exceeded")
        response.headers["retry-after"] = str(entered.retry_after)
        return response
    if isinstance(entered[1], Overloaded):
        admission, why = entered
        _background(
            count(
                principal,
                model,
                ok=False,
                body_usage=None,
                admission=admission,
                limited=why.kind == "fair_share",
            )
        )
        return _overloaded(model, why)
    admission, upstreams, lease = entered
    try:
        return await _send(request, principal, model, payload, upstreams, admission, lease)
    except BaseException:
        _count_failure(principal, model, admission, lease)
        raise


def _overloaded(model: str, why: Overloaded) -> Response:
    if why.kind == "fair_share":
        response = error(
            429,
            f"every replica of {model!r} is full and this token has its fair share "
            f"({why.share} requests) in flight: retry when one ends",
            "fair_share",
            None,
            "rate_limit_exceeded",
        )
    else:
        response = error(
            503,
            f"every replica of {model!r} holds more than twice the requests it runs at once: "
            "shedding load rather than queueing without bound",
            "service_unavailable",
            None,
            "overloaded",
        )
    response.headers["retry-after"] = "1"
    return response


async def _send(
    request: Request,
    principal: Principal,
    model: str,
    payload: dict,
    upstreams: list[Upstream],
    admission: Admission,
    lease: Lease,
) -> Response:
    """Send an admitted request to the first replica that takes it (the picked one first)
    and relay the answer. It returns a response whose end calls `count`, or raises (the
    caller calls it): the admission and the lease end exactly once."""
    stream = payload.get("stream") is True
    options = payload.get("stream_options")
    strip_usage = False
    if (
        stream
        and request.url.path in USAGE_CHUNK_PATHS
        and not (isinstance(options, dict) and options.get("include_usage"))
    ):
        # ask for the usage chunk to count tokens; the client did not ask, so it is not relayed
        payload["stream_options"] = {
            **(options if isinstance(options, dict) else {}),
            "include_usage": True,
        }
        strip_usage = True
    # re-encoded, never the client's bytes: the engine parses exactly what was checked here
    body = orjson.dumps(payload)
    headers = {k: v for k in FORWARD_HEADERS if (v := request.headers.get(k))}
    headers["content-type"] = "application/json"
    headers["accept-encoding"] = "identity"

    tried: list[str] = []
    for n, up in enumerate(upstreams[:MAX_TRIES]):
        if n:
            await router.move(redis_client(), lease, up)
        try:
            upstream = await client().post(
                up.url + request.url.path, data=body, headers=_upstream_headers(headers, up)
            )
        except REFUSED as exc:
            router.mark_down(up)
            tried.append(f"{up.name}: {type(exc).__name__}")
            continue
        if upstream.status in RETRY_STATUS:
            upstream.close()
            router.mark_down(up)
            tried.append(f"{up.name}: HTTP {upstream.status}")
            continue
        break
    else:
        _count_failure(principal, model, admission, lease)
        return error(503, "every replica refused: " + "; ".join(tried), "service_unavailable")

    reply_headers = {"x-npc-replica": up.name}
    ctype = upstream.headers.get("content-type", "application/json")
    if not ctype.startswith("text/event-stream"):
        try:
            data = await _read_capped(upstream)
        except BaseException:
            upstream.close()  # half read: the connection cannot be reused
            raise
        if data is None:
            upstream.close()
            log.warning("replica %s answered over %d bytes: cut off", up.name, MAX_ANSWER)
            _count_failure(principal, model, admission, lease)
            return error(
                502, f"the replica's answer is over {MAX_ANSWER} bytes", "service_unavailable"
            )
        upstream.release()
        body_usage = None
        if upstream.status == 200:
            try:
                body_usage = orjson.loads(data).get("usage")
            except (ValueError, AttributeError):
                pass
        return Response(
            data,
            upstream.status,
            headers=reply_headers,
            media_type=ctype,
            # counted after the answer is sent: off the request's critical path
            background=BackgroundTask(
                count,
                principal,
                model,
                ok=upstream.status < 400,
                body_usage=body_usage,
                admission=admission,
                lease=lease,
            ),
        )

    relay = _relay(upstream, up, principal, model, strip_usage, admission, lease)
    return StreamingResponse(
        relay,
        status_code=upstream.status,
        media_type="text/event-stream",
        headers={**reply_headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        # When the client goes away Starlette cancels the sending task, possibly while the
        # relay waits at a `yield`: then nothing runs its `finally` until the generator is
        # garbage-collected, and the replica generates on for nobody. Closing it here, right
        # after the response ends (a no-op when it ran to its end), closes the upstream
        # connection at once, which is what makes vLLM abort the request.
        background=BackgroundTask(relay.aclose),
    )


async def _read_capped(upstream: aiohttp.ClientResponse) -> bytes | None:
    """The whole answer, or None when it is (or says it will be) over MAX_ANSWER bytes."""
    if (upstream.content_length or 0) > MAX_ANSWER:
        return None
    parts, size = [], 0
    async for chunk in upstream.content.iter_any():
        size += len(chunk)
        if size > MAX_ANSWER:
            return None
        parts.append(chunk)
    return b"".join(parts)


class _EventTooLong(Exception):
    pass


def _upstream_headers(headers: dict[str, str], up: Upstream) -> dict[str, str]:
    """The forwarded headers plus the replica's engine key (vLLM refuses /v1 without it)."""
    return {**headers, "authorization": f"Bearer {up.api_key}"} if up.api_key else headers


async def _relay(
    upstream: aiohttp.ClientResponse,
    up: Upstream,
    principal: Principal,
    model: str,
    strip_usage: bool,
    admission: Admission,
    lease: Lease,
) -> AsyncIterator[bytes]:
    """Relay server-sent events as they arrive; count the usage chunk; close upstream on exit
    (end of stream, client disconnect or cancellation alike: closing an unfinished answer's
    connection is what makes vLLM abort the request)."""
    buf = bytearray()
    body_usage = None
    ok = upstream.status < 400
    try:
        async for chunk in upstream.content.iter_any():
            start = max(0, len(buf) - 1)  # a "\n\n" can only end in what just came
            buf += chunk
            while (end := buf.find(b"\n\n", start)) >= 0:
                event = bytes(buf[: end + 2])
                del buf[: end + 2]
                start = 0
                if b'"usage"' in event:
                    try:
                        data = orjson.loads(event.removeprefix(b"data: ").strip())
                        body_usage = data.get("usage") or body_usage
                        if strip_usage and not data.get("choices"):
                            continue
                    except (ValueError, AttributeError):
                        pass
                yield event
            if len(buf) > MAX_EVENT:
                raise _EventTooLong
            await limiter.renew(redis_client(), admission)
            await router.renew(redis_client(), lease)
        if buf:
            yield bytes(buf)
    except (aiohttp.ClientError, TimeoutError) as exc:  # the replica died mid-stream
        ok = False
        log.warning("replica %s broke off a stream: %s", up.name, exc)
    except _EventTooLong:
        ok = False
        log.warning("replica %s sent an event over %d bytes: stream cut", up.name, MAX_EVENT)
    finally:
        if upstream.content.at_eof():
            upstream.release()  # the whole answer was read: the connection is kept
        else:
            upstream.close()
        _background(
            count(principal, model, ok=ok, body_usage=body_usage, admission=admission, lease=lease)
        )


@contextlib.asynccontextmanager
async def lifespan(_app: Starlette) -> AsyncIterator[None]:
    # Starlette streams through an anyio task group, and anyio imports its asyncio backend on
    # first use: measured 86-780 ms on the first streamed answer, while the replica went on
    # generating (a client that left then was noticed too late to abort). Loaded here.
    async with anyio.create_task_group():
        pass
    # Start-up leaves ~100,000 objects (Django, the URL conf, the rule base) that live as long
    # as the process, and each full collection walked them all: 46 ms with nothing else
    # running, a pause every request in flight then waited out (the gateway's p99 at
    # concurrency 32, docs/gateway.md). Frozen, a full collection walks only what serving
    # allocated (Python's gc.freeze, made for long-lived servers).
    gc.collect()
    gc.freeze()
    yield
    for c in list(_clients.values()):
        await c.close()
    _clients.clear()


# The engine's own routes taking a JSON body that names the model, relayed with the same
# token check, limits and routing as completions (the route table of vLLM 0.32's
# vllm/entrypoints: serve/tokenize/api_router.py, pooling/*/api_router.py, openai/*). The
# engine's control routes (/sleep, /collective_rpc, /start_profile, /v1/load_lora_adapter, …)
# are never relayed: they act on the replica, not on a request. Multipart routes (audio) are
# not relayed yet.
FORWARDED = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/score",
    "/v1/rerank",
    "/v2/rerank",
    "/v2/embed",
    "/tokenize",
    "/detokenize",
    "/pooling",
    "/classify",
    "/score",
    "/rerank",
)
# the ones outside /v1 that console/asgi.py hands to this app rather than to Django
ROOT_PATHS = frozenset(p for p in FORWARDED if not p.startswith("/v1/"))

app = Starlette(
    routes=[
        Route("/v1/models", models, methods=["GET"]),
        *(Route(path, forward, methods=["POST"]) for path in FORWARDED),
    ],
    lifespan=lifespan,
)
