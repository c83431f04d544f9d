"""Rolling updates (console/deployments/rollout.py): replicas replaced one at a time, an old
one stopped only after the new one answered a test completion, a failing new generation
rolled back. The agent is played by the test: what the console dispatches is answered with
the engine reports an agent sends (apply_report). Promises: docs/operations.md "Rolling
updates"; the same with real agents: tests/faults/test_rollout.py."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.deployments import rollout, services
from console.deployments.engines import apply_report
from console.deployments.models import Deployment, Replica, ReplicaEvent, Rollout
from console.deployments.reconcile import reconcile
from console.deployments.schemas import DeploymentIn
from console.diagnosis.models import Incident
from console.hot import get_redis
from tests.factories import make_node
from tests.kit import FakeEngine

SPEC = {
    "model_path": "/models/m",
    "model_label": "",
    "served_model_name": "m",
    "device": "npu",
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "dtype": "auto",
    "max_model_len": 4096,
    "gpu_memory_utilization": 0.9,
    "block_size": 128,
    "extra_args": [],
    "extra_env": {},
    "replicas": 2,
    "npus_per_replica": 2,
}


@pytest.fixture
def actor(operator):
    return Actor(user=operator, name="otto")


class Agent:
    """What the console sent (in order, with the test completions asked), and an agent that
    answers each start with `phase` (ready unless set per replica) and each stop with
    stopped."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self.pending: list[tuple[str, int]] = []
        self.phase: dict[int, str] = {}  # replica id -> what its next start reports
        self.answers = True  # what the test completion answers

    def start(self, replica) -> None:
        self.log.append(("start", replica.pk))
        self.pending.append(("start", replica.pk))

    def stop(self, replica) -> None:
        self.log.append(("stop", replica.pk))
        self.pending.append(("stop", replica.pk))

    def completion(self, replica) -> tuple[bool, str]:
        self.log.append(("completion", replica.pk))
        ok = self.answers if isinstance(self.answers, bool) else (self.answers or [True]).pop(0)
        return ok, "HTTP 200" if ok else "HTTP 500"

    def answer(self) -> None:
        while self.pending:
            kind, pk = self.pending.pop(0)
            replica = Replica.objects.filter(pk=pk).select_related("node").first()
            if replica is None or replica.node is None:
                continue
            if kind == "stop":
                report(replica, "stopped", reason="stopped as asked")
                continue
            report(replica, "starting", reason="engine starting")
            phase = self.phase.pop(pk, "ready")  # once: a later start is ready
            replica.refresh_from_db()
            report(replica, phase, reason=f"engine {phase}")


@pytest.fixture
def agent(monkeypatch):
    a = Agent()
    for module in ("reconcile", "rollout"):
        monkeypatch.setattr(f"console.deployments.{module}.dispatch_start", a.start)
        monkeypatch.setattr(f"console.deployments.{module}.dispatch_stop_replica", a.stop)
    monkeypatch.setattr("console.deployments.rollout.test_completion", a.completion)
    return a


def report(replica, phase, **extra):
    return apply_report(
        {
            "node": replica.node.name,
            "replica_id": replica.pk,
            "generation": replica.generation,
            "phase": phase,
            "at": datetime.now(UTC).isoformat(),
            **extra,
        },
        node=replica.node.name,
    )


def running(actor, agent, npus: int, replicas: int = 2) -> list[Replica]:
    """Deployment d1 on node `a` with `npus` chips, every replica READY on spec v1."""
    make_node("a", npus=npus)
    services.create_deployment(
        actor=actor, payload=DeploymentIn(name="d1", **SPEC | {"replicas": replicas})
    )
    services.set_desired(actor=actor, name="d1", state="running")
    pass_(agent)
    reconcile()
    assert Replica.objects.filter(state="ready", spec_version=1).count() == replicas
    assert Deployment.objects.get(name="d1").good_version == 1  # fully rolled out
    return list(Replica.objects.order_by("index"))


def pass_(agent: Agent | None = None) -> None:
    reconcile()
    if agent is not None:
        agent.answer()


def update(actor, **spec) -> Deployment:
    return services.update_deployment(
        actor=actor, name="d1", payload=DeploymentIn(name="d1", **SPEC | spec)
    )


def ready_count() -> int:
    return Replica.objects.filter(deployment__name="d1", state="ready").count()


def roll(agent: Agent, *, until, passes: int = 40) -> list[int]:
    """Reconcile passes, the agent answering after each, until `until()`: the READY count
    after every pass and every answer."""
    seen = []
    for _ in range(passes):
        reconcile()
        seen.append(ready_count())
        agent.answer()
        seen.append(ready_count())
        if until():
            return seen
    raise AssertionError(f"not done after {passes} passes: {seen}")


def rollout_state() -> str | None:
    ro = Rollout.objects.filter(deployment__name="d1").first()
    return ro.state if ro else None


def test_surge_rollout_replaces_one_at_a_time_and_never_drops_below_replicas_ready(
    actor, agent, fake_inspect
):
    old = running(actor, agent, npus=8)  # 4 of 8 NPUs used: room for one more replica
    agent.log.clear()
    update(actor, max_model_len=2048)
    seen = roll(agent, until=lambda: rollout_state() == "done")

    assert min(seen) >= 2, seen  # never fewer than `replicas` READY
    starts = [pk for kind, pk in agent.log if kind == "start"]
    stops = [pk for kind, pk in agent.log if kind == "stop"]
    assert len(starts) == 2 and stops == [old[0].pk, old[1].pk]  # one at a time, in order
    for new, gone in zip(starts, stops, strict=True):
        # each old replica is told to stop only after its replacement answered
        assert agent.log.index(("completion", new)) < agent.log.index(("stop", gone))
        # and the second surge replica starts only after the first old one stopped
    assert agent.log.index(("stop", stops[0])) < agent.log.index(("start", starts[1]))
    rows = list(Replica.objects.order_by("index").values_list("pk", "index", "state"))
    assert rows == [(starts[0], 0, "ready"), (starts[1], 1, "ready")]  # exactly `replicas` rows
    dep = Deployment.objects.get(name="d1")
    assert Replica.objects.filter(spec_version=dep.spec_version).count() == 2
    assert (dep.good_version, dep.good_spec["max_model_len"]) == (2, 2048)
    surge = ReplicaEvent.objects.filter(replica_id=starts[0], to_state="scheduled").get()
    assert "surge replica" in surge.reason
    assert not Replica.objects.filter(pk__in=[r.pk for r in old]).exists()  # rows removed
    assert ReplicaEvent.objects.filter(reason__contains="the old replica 0 was removed").exists()


def test_in_place_when_no_capacity_keeps_replicas_minus_one_ready(actor, agent, fake_inspect):
    old = running(actor, agent, npus=4)  # every NPU held: no surge replica fits
    agent.log.clear()
    services.restart_deployment(actor=actor, name="d1")  # an asked restart rolls too
    seen = roll(agent, until=lambda: rollout_state() == "done")

    assert min(seen) >= 1, seen  # never fewer than replicas - 1 READY
    assert not [kind for kind, _ in agent.log if kind == "stop"]  # replaced, same placement
    assert [pk for kind, pk in agent.log if kind == "start"] == [old[0].pk, old[1].pk]
    first_restart = agent.log.index(("start", old[1].pk))
    assert agent.log.index(("completion", old[0].pk)) < first_restart  # 0 answered first
    drain = ReplicaEvent.objects.filter(replica=old[0], to_state="draining").get()
    assert "replaced in place (no free capacity" in drain.reason
    assert list(Replica.objects.values_list("spec_version", "state")) == [(2, "ready")] * 2


def test_old_replica_is_drained_until_the_gateway_has_no_request_in_flight(
    actor, agent, fake_inspect
):
    old = running(actor, agent, npus=8)
    key = f"{rollout.INFLIGHT}{old[0].pk}"
    get_redis().zadd(key, {"req-1": time.time() + 600})  # a request the gateway has in flight
    update(actor, max_model_len=2048)
    for _ in range(6):
        pass_(agent)
    old[0].refresh_from_db()
    assert old[0].state == "draining"  # out of routing (the gateway routes READY only)...
    assert ("stop", old[0].pk) not in agent.log  # ...and not told to stop while it serves
    get_redis().zrem(key, "req-1")
    pass_(agent)
    assert ("stop", old[0].pk) in agent.log
    reconcile()  # stopped: its row goes, the surge row takes index 0
    assert not Replica.objects.filter(pk=old[0].pk).exists()
    assert Replica.objects.get(index=0).spec_version == 2


def test_old_replica_stays_until_the_new_one_answers_a_test_completion(actor, agent, fake_inspect):
    old = running(actor, agent, npus=8)
    agent.answers = [False, False, True]
    update(actor, max_model_len=2048)
    for _ in range(3):
        pass_(agent)
    old[0].refresh_from_db()
    assert old[0].state == "ready" and ("stop", old[0].pk) not in agent.log
    failed = ReplicaEvent.objects.filter(reason__contains="test completion 2 of 3 failed")
    assert failed.exists()
    roll(agent, until=lambda: rollout_state() == "done")
    assert Deployment.objects.get(name="d1").max_model_len == 2048


def test_failing_the_test_completion_rolls_back(actor, agent, fake_inspect):
    running(actor, agent, npus=8)
    agent.answers = False
    update(actor, max_model_len=2048)
    roll(agent, until=lambda: rollout_state() == "rolling-back")
    ro = Rollout.objects.get()
    assert "failed the test completion 3 times" in ro.reason


@pytest.mark.parametrize("npus", [8, 4], ids=["surge", "in-place"])
def test_crash_looping_generation_rolls_back_to_the_last_good_spec(
    actor, agent, fake_inspect, npus
):
    old = running(actor, agent, npus=npus)
    update(actor, max_model_len=2048)
    reconcile()  # the first step begins
    ro = Rollout.objects.get()
    agent.phase[ro.step_new_id] = "crash-loop"
    seen = roll(agent, until=lambda: rollout_state() == "rolled-back")

    assert min(seen) >= (2 if npus == 8 else 1), seen
    dep = Deployment.objects.get(name="d1")
    assert (dep.spec_version, dep.max_model_len) == (1, 4096)  # the good spec again
    rows = list(Replica.objects.order_by("index").values_list("index", "state", "spec_version"))
    assert rows == [(0, "ready", 1), (1, "ready", 1)]
    if npus == 8:  # the old replicas were never touched; the surge row is gone
        assert [r.pk for r in Replica.objects.order_by("index")] == [r.pk for r in old]
    ro.refresh_from_db()
    assert ro.summary.startswith("Rolled back to v1: replica") and "crash-loops" in ro.reason
    incident = Incident.objects.get(category="rollout-failed")
    assert incident.status == "open" and "rolled back to v1" in incident.title
    audit = AuditEntry.objects.get(action="deployment.rollback")
    assert audit.via == "system" and audit.after["spec_version"] == 1
    assert ReplicaEvent.objects.filter(reason__contains="rolled back to spec v1").exists()
    # the bad version is never issued again: the next change gets a new number
    assert update(actor, max_model_len=1024).spec_version == 3


def test_not_ready_within_the_deadline_rolls_back(actor, agent, fake_inspect, settings):
    running(actor, agent, npus=8)
    settings.ROLLOUT_READY_TIMEOUT_S = 0
    update(actor, max_model_len=2048)
    reconcile()
    agent.phase[Rollout.objects.get().step_new_id] = "loading"  # never gets ready
    roll(agent, until=lambda: rollout_state() in ("rolling-back", "rolled-back"))
    assert "not ready within 0s" in Rollout.objects.get().reason


def test_a_failed_rollback_stops_trying(actor, agent, fake_inspect):
    running(actor, agent, npus=4)  # in place: replica 0 runs the new spec when it fails
    agent.answers = False  # neither the new nor the old spec answers
    update(actor, max_model_len=2048)
    roll(agent, until=lambda: rollout_state() == "failed", passes=80)
    ro = Rollout.objects.get()
    assert ro.reason.startswith("rollback failed")
    assert Incident.objects.get(category="rollout-failed").severity == "critical"
    before = list(agent.log)
    for _ in range(3):
        pass_(agent)
    assert agent.log == before  # nothing more is tried until the spec changes


def test_api_and_page_show_the_rollout(actor, agent, fake_inspect, operator_client):
    running(actor, agent, npus=8, replicas=3)
    update(actor, max_model_len=2048, replicas=3)
    roll(agent, until=lambda: Rollout.objects.get().replaced == 1)
    body = operator_client.get("/api/v1/deployments/d1").json()
    assert body["rollout"]["state"] == "rolling" and body["rollout"]["to_version"] == 2
    assert body["rollout"]["summary"].startswith("Rolling out spec v2: 1 of 3 replaced")
    page = operator_client.get("/deployments/d1/").content.decode()
    assert "Rolling out spec v2: 1 of 3 replaced" in page


def test_completion_is_a_real_one_token_request_with_the_engine_key(db):
    from console.deployments.models import engine_api_key

    node = make_node("c", npus=0, address="127.0.0.1")
    dep = Deployment.objects.create(name="c1", model_path="/m", served_model_name="tiny")
    replica = Replica.objects.create(deployment=dep, index=0, node=node)
    with FakeEngine(model="tiny", api_key=engine_api_key(replica.pk)) as engine:
        replica.port = engine.port
        ok, detail = rollout.test_completion(replica)
        assert ok, detail
        assert engine.requests[-1] == {"model": "tiny", "prompt": "ping", "max_tokens": 1}
        with FakeEngine(model="tiny", api_key="another-key") as other:
            replica.port = other.port
            assert rollout.test_completion(replica) == (
                False,
                f"HTTP 401 from http://127.0.0.1:{other.port}",
            )


# --- canary -----------------------------------------------------------------------------------
def canary_held() -> bool:
    ro = Rollout.objects.filter(deployment__name="d1").first()
    return ro is not None and ro.canary_held


def test_a_canary_waits_for_promotion_then_the_rollout_goes_on(
    actor, agent, fake_inspect, operator_client
):
    old = running(actor, agent, npus=8)
    resp = operator_client.put(
        "/api/v1/deployments/d1/canary", {"percent": 10}, content_type="application/json"
    )
    assert resp.status_code == 200 and resp.json()["canary_percent"] == 10
    update(actor, max_model_len=2048)
    roll(agent, until=canary_held)
    for _ in range(5):  # it waits: both old replicas keep serving beside the canary
        pass_(agent)
    assert Replica.objects.filter(pk__in=[r.pk for r in old], state="ready").count() == 2
    assert not [kind for kind, _ in agent.log if kind == "stop"]
    body = operator_client.get("/api/v1/deployments/d1").json()["rollout"]
    assert body["canary_held"] and body["canary_percent"] == 10
    assert body["summary"].startswith("Canary: one replica on spec v2 takes 10% of requests")
    from console.gateway.routing import _read_table

    assert _read_table().canaries == {"m": (2, 10)}  # what the gateway splits traffic by

    resp = operator_client.post("/api/v1/deployments/d1/rollout/promote")
    assert resp.status_code == 200 and resp.json()["promoted_at"]
    assert _read_table().canaries == {}  # promoted: no split any more
    roll(agent, until=lambda: rollout_state() == "done")
    assert list(Replica.objects.values_list("spec_version", flat=True)) == [2, 2]
    assert AuditEntry.objects.filter(action="deployment.canary.promote").exists()
    # nothing to promote any more
    assert operator_client.post("/api/v1/deployments/d1/rollout/promote").status_code == 409


def test_a_canary_rolled_back_by_an_operator_restores_the_good_spec(
    actor, agent, fake_inspect, operator_client
):
    running(actor, agent, npus=8)
    rollout.set_canary(actor=actor, name="d1", percent=25)
    update(actor, max_model_len=2048)
    roll(agent, until=canary_held)
    resp = operator_client.post("/api/v1/deployments/d1/rollout/rollback")
    assert resp.status_code == 200 and resp.json()["state"] == "rolling-back"
    roll(agent, until=lambda: rollout_state() == "rolled-back")
    pass_(agent)  # the stopped canary row, past the replica count, goes
    dep = Deployment.objects.get(name="d1")
    assert (dep.spec_version, dep.max_model_len) == (1, 4096)
    assert list(Replica.objects.values_list("spec_version", "state")) == [(1, "ready")] * 2
    assert not Incident.objects.exists()  # an operator's decision, not a failure


def test_a_canary_that_crashes_rolls_back_by_itself(actor, agent, fake_inspect):
    running(actor, agent, npus=8)
    rollout.set_canary(actor=actor, name="d1", percent=10)
    update(actor, max_model_len=2048)
    roll(agent, until=canary_held)
    canary = Replica.objects.get(pk=Rollout.objects.get().step_new_id)
    report(canary, "failed", reason="engine died")
    canary.refresh_from_db()
    report(canary, "crash-loop", reason="engine died 5 times")
    roll(agent, until=lambda: rollout_state() == "rolled-back")
    assert "canary replica" in Rollout.objects.get().reason
    assert Incident.objects.exists()


def test_canary_percent_is_validated(actor, agent, fake_inspect, operator_client, viewer_client):
    running(actor, agent, npus=8)
    bad = operator_client.put(
        "/api/v1/deployments/d1/canary", {"percent": 100}, content_type="application/json"
    )
    assert bad.status_code == 422 and "percent" in bad.content.decode()
    denied = viewer_client.put(
        "/api/v1/deployments/d1/canary", {"percent": 10}, content_type="application/json"
    )
    assert denied.status_code == 403
    assert Deployment.objects.get(name="d1").canary_percent == 0


def test_the_gateway_sends_the_canary_its_share():
    from console.gateway.routing import Upstream, canary_share

    ups = [
        Upstream(1, "d/0", "u0", 0, spec_version=1),
        Upstream(2, "d/1000", "u1", 0, spec_version=2),
    ]
    picks = [canary_share(ups, (2, 10), draw)[0].replica_id for draw in range(100)]
    assert picks.count(2) == 10 and picks.count(1) == 90
    assert canary_share(ups, None, 5) == ups  # no canary: every replica
    only_new = [ups[1]]
    assert canary_share(only_new, (2, 10), 50) == only_new  # one generation left: it serves


def test_two_passes_starting_the_same_surge_replica_is_a_lost_race_not_an_error(
    actor, agent, fake_inspect, monkeypatch, caplog
):
    """The beat's pass and the one a settings change kicks both reach the surge step: the
    second's insert of the surge row fails on (deployment, index); it steps aside (found by
    bench/rolling_update.py, which logged an error with a traceback each time)."""
    running(actor, agent, npus=8)
    update(actor, max_model_len=2048)
    real = rollout._start_surge

    def other_pass_first(dep, ro, old, latest, word):
        Replica.objects.create(deployment=dep, index=rollout.SURGE_INDEX)  # the other pass
        return real(dep, ro, old, latest, word)

    monkeypatch.setattr(rollout, "_start_surge", other_pass_first)
    with caplog.at_level("ERROR"):
        reconcile()
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    assert Rollout.objects.get().step_new_id is None  # this pass claimed nothing
    monkeypatch.setattr(rollout, "_start_surge", real)
    reconcile()  # the next pass goes on as usual
    assert Rollout.objects.get().step_mode == "surge"
