"""The built-in load generator: an asyncio + httpx client streaming `/v1/completions`.

Why not `vllm bench serve`? It needs vLLM importable where the client runs, and the console
host (where this runs, on the console's Celery worker) normally has no vLLM: engines live in
their own environment on the NPU hosts. This client measures the same things the same way
(see stats.py) and needs only httpx.

Django-free on purpose: `LoadRun` runs its event loop in a thread of its own; the caller
(services.execute_run) reads `snapshot()` about once a second to store progress, and calls
`stop()` to cancel. Guarantees: every request sent ends up counted exactly once, as done, as an
error (with a message) or as unfinished (cut off by a cancel or the end-of-run drain limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from array import array
from dataclasses import dataclass, field

import httpx

from console.benchmarks.stats import percentile, summarize

DRAIN_S = 60.0  # after the duration, wait at most this long for requests still streaming
MAX_IN_FLIGHT = 1024  # open-loop (request rate) safety cap on concurrent requests
ERROR_SAMPLES = 5
# Prompts are random sequences of these words (local, nothing downloaded); each request gets
# its own sequence, so the engine's prefix cache cannot turn the test into a cache benchmark.
WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect use class control care field development role effort rate heart drug "
    "show leader light voice wife police mind price report decision son view relationship town "
    "road arm difference value building action model season society tax director position "
    "player record paper space ground form event official matter center couple site project "
    "activity star table need court oil situation cost industry figure street image phone data"
).split()


@dataclass(frozen=True)
class LoadParams:
    model: str
    prompt_tokens: int
    output_tokens: int
    duration_s: float
    concurrency: int | None = None
    request_rate: float | None = None
    max_requests: int | None = None
    seed: int | None = None
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.request_rate is None):
            raise ValueError("give exactly one of concurrency and request_rate")


@dataclass
class Progress:
    requests: int
    errors: int
    in_flight: int
    elapsed_s: float


@dataclass
class _Second:
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    in_flight: int = 0
    ttfts: list[float] = field(default_factory=list)


class Recorder:
    """What happened, request by request and second by second (thread-safe reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.t0 = time.perf_counter()
        self.ttfts: list[float] = []
        self.itls = array("d")
        self.e2es: list[float] = []
        self.prompt_tokens: list[int] = []
        self.output_tokens = 0
        self.errors = 0
        self.unfinished = 0
        self.in_flight = 0
        self.error_samples: list[str] = []
        self.last_done = 0.0  # offset of the last finished request
        self.seconds: dict[int, _Second] = {}

    def _sec(self, now: float) -> _Second:
        sec = self.seconds.setdefault(int(now - self.t0), _Second())
        sec.in_flight = max(sec.in_flight, self.in_flight)
        return sec

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1
            self._sec(time.perf_counter())

    def chunk(self, now: float) -> None:
        with self._lock:
            self._sec(now).output_tokens += 1

    def done(self, *, ttft: float, itls: list[float], e2e: float, usage: dict | None) -> None:
        now = time.perf_counter()
        with self._lock:
            self.in_flight -= 1
            self.ttfts.append(ttft)
            self.itls.extend(itls)
            self.e2es.append(e2e)
            usage = usage or {}
            chunks = len(itls) + 1
            tokens = int(usage.get("completion_tokens") or chunks)
            self.output_tokens += tokens
            if usage.get("prompt_tokens"):
                self.prompt_tokens.append(int(usage["prompt_tokens"]))
            sec = self._sec(now)
            # A busy engine may pack several tokens into one chunk: the timeline counted
            # chunks as they came; the rest of the request's tokens land in this second.
            sec.output_tokens += max(0, tokens - chunks)
            sec.requests += 1
            sec.ttfts.append(ttft)
            self.last_done = max(self.last_done, now - self.t0)

    def failed(self, message: str) -> None:
        with self._lock:
            self.in_flight -= 1
            self.errors += 1
            self._sec(time.perf_counter()).errors += 1
            if len(self.error_samples) < ERROR_SAMPLES and message not in self.error_samples:
                self.error_samples.append(message[:300])

    def cut_off(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self.unfinished += 1

    def snapshot(self) -> Progress:
        with self._lock:
            return Progress(
                requests=len(self.e2es),
                errors=self.errors,
                in_flight=self.in_flight,
                elapsed_s=round(time.perf_counter() - self.t0, 2),
            )

    def timeline(self) -> dict:
        """Per-second columns for charts: x = seconds since the start."""
        with self._lock:
            last = max(self.seconds, default=-1)
            rows = [self.seconds.get(i, _Second()) for i in range(last + 1)]
            p50 = [percentile(r.ttfts, 50) for r in rows]
            return {
                "t": list(range(last + 1)),
                "requests": [r.requests for r in rows],
                "output_tokens": [r.output_tokens for r in rows],
                "errors": [r.errors for r in rows],
                "in_flight": [r.in_flight for r in rows],
                "ttft_p50_ms": [None if v is None else round(v * 1000, 2) for v in p50],
            }

    def results(self) -> dict:
        with self._lock:
            out = summarize(
                ttfts=self.ttfts,
                itls=self.itls,
                e2es=self.e2es,
                output_tokens=self.output_tokens,
                prompt_tokens=self.prompt_tokens,
                duration_s=self.last_done,
            )
            out.update(
                errors=self.errors, unfinished=self.unfinished, error_samples=self.error_samples
            )
            return out


class RequestFailed(Exception):
    pass


def prompt_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=max(1, words)))


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The engine key as vLLM wants it (its /v1 answers 401 without it)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def tokens_per_word(
    client: httpx.AsyncClient, base_url: str, model: str, headers: dict[str, str] | None = None
) -> float:
    """Ask the engine's tokenizer (vLLM's POST /tokenize) how many tokens a word of our prompts
    costs, so prompts land near the asked length; 1.0 when the engine cannot say."""
    sample = prompt_text(random.Random(0), 200)
    try:
        resp = await client.post(
            f"{base_url}/tokenize",
            json={"model": model, "prompt": sample},
            headers=headers,
            timeout=10,
        )
        count = int(resp.json()["count"]) if resp.status_code == 200 else 0
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        count = 0
    return max(0.2, count / 200) if count else 1.0


async def one_request(
    client: httpx.AsyncClient,
    base_url: str,
    body: dict,
    rec: Recorder,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> None:
    """Send one streamed completion; record it as done, failed or cut off."""
    rec.started()
    t0 = last = time.perf_counter()
    ttft: float | None = None
    itls: list[float] = []
    usage = None
    try:
        async with client.stream(
            "POST", f"{base_url}/v1/completions", json=body, headers=headers, timeout=timeout
        ) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                raise RequestFailed(f"HTTP {resp.status_code}: {text}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    raise RequestFailed(f"engine error: {chunk['error']}")
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if chunk.get("choices"):  # like vllm bench: a chunk counts even if its text is ""
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        itls.append(now - last)
                    last = now
                    rec.chunk(now)
        if ttft is None:
            raise RequestFailed("the answer had no tokens")
        rec.done(ttft=ttft, itls=itls, e2e=time.perf_counter() - t0, usage=usage)
    except asyncio.CancelledError:
        rec.cut_off()
        raise
    except (httpx.HTTPError, RequestFailed, ValueError) as exc:
        rec.failed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


class LoadRun:
    """One load test against one or more base URLs (requests go round-robin). api_keys: the
    engine key of each target, in the same order (None: send none)."""

    def __init__(
        self,
        params: LoadParams,
        base_urls: list[str],
        api_keys: list[str | None] | None = None,
    ) -> None:
        if not base_urls:
            raise ValueError("no target to send requests to")
        keys = list(api_keys) if api_keys is not None else [None] * len(base_urls)
        if len(keys) != len(base_urls):
            raise ValueError("one api key per target")
        self.params, self.base_urls = params, base_urls
        self._headers = [auth_headers(k) for k in keys]
        self.recorder = Recorder()
        self.words_per_prompt = params.prompt_tokens
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="benchmark-load", daemon=True)

    # -- the caller's side ---------------------------------------------------------------
    def start(self) -> LoadRun:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Cancel: stop sending and cut off requests in flight (returns at once)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """True when the run is over."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def snapshot(self) -> Progress:
        return self.recorder.snapshot()

    # -- the load thread -----------------------------------------------------------------
    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, not lost
            self.error = exc

    async def _run(self) -> None:
        p = self.params
        cap = p.concurrency or MAX_IN_FLIGHT
        limits = httpx.Limits(max_connections=cap, max_keepalive_connections=cap)
        async with httpx.AsyncClient(limits=limits, timeout=p.request_timeout_s) as client:
            ratio = await tokens_per_word(client, self.base_urls[0], p.model, self._headers[0])
            self.words_per_prompt = max(1, int(p.prompt_tokens / ratio))
            self.recorder = Recorder()  # the clock starts with the first request
            rng = random.Random(p.seed)
            issued = iter(range(p.max_requests or 10**12))
            deadline = time.perf_counter() + p.duration_s
            tasks: set[asyncio.Task] = set()

            def send() -> asyncio.Task | None:
                n = next(issued, None)
                if n is None or self._stop.is_set() or time.perf_counter() >= deadline:
                    return None
                body = {
                    "model": p.model,
                    "prompt": prompt_text(rng, self.words_per_prompt),
                    "max_tokens": p.output_tokens,
                    "ignore_eos": True,  # fixed output length, as vllm bench does
                    "temperature": 0.0,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                i = n % len(self.base_urls)
                task = asyncio.create_task(
                    one_request(
                        client,
                        self.base_urls[i],
                        body,
                        self.recorder,
                        p.request_timeout_s,
                        self._headers[i],
                    )
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                return task

            if p.concurrency:
                await self._closed_loop(send, p.concurrency, deadline)
            else:
                await self._open_loop(send, rng, p.request_rate or 1.0, deadline)
            await self._drain(tasks, deadline + DRAIN_S)

    async def _closed_loop(self, send, concurrency: int, deadline: float) -> None:
        """`concurrency` users, each sending its next request when its last one is answered."""

        async def user() -> None:
            while (task := send()) is not None:
                await asyncio.wait({task})

        users = [asyncio.create_task(user()) for _ in range(concurrency)]
        while not all(u.done() for u in users):
            if self._stop.is_set() or time.perf_counter() >= deadline:
                break  # requests still in flight are left to _drain
            await asyncio.wait(users, timeout=0.1)
        for u in users:
            u.cancel()

    async def _open_loop(self, send, rng: random.Random, rate: float, deadline: float) -> None:
        """Poisson arrivals: exponential gaps with mean 1/rate, independent of answers."""
        next_at = time.perf_counter()
        while not self._stop.is_set():
            next_at += rng.expovariate(rate)
            while (wait := next_at - time.perf_counter()) > 0 and not self._stop.is_set():
                await asyncio.sleep(min(wait, 0.1))
            if next_at >= deadline:
                return
            if self.recorder.in_flight >= MAX_IN_FLIGHT:
                continue  # the engine cannot keep up; the cap protects this process
            if send() is None:
                return

    async def _drain(self, tasks: set[asyncio.Task], deadline: float) -> None:
        """Let requests in flight finish until `deadline` (not after a cancel); cut off the rest."""
        while tasks and not self._stop.is_set() and time.perf_counter() < deadline:
            await asyncio.wait(set(tasks), timeout=0.1)
        for task in list(tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
