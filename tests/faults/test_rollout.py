"""Rolling updates with real processes: a host agent, its supervisor and the kit's fake vLLM
as the engine, a console worker taking the agent's reports; the reconcile loop is run by the
test (as the beat would), and the test completion is a real HTTP request to each engine.
Promises: docs/operations.md "Rolling updates" (the step-by-step cases are in
tests/console/deployments/test_rollout.py)."""

from __future__ import annotations

import pytest

from console.accounts.services import Actor
from console.deployments import services
from console.deployments.models import Deployment, Replica, ReplicaEvent, Rollout
from console.deployments.reconcile import reconcile
from console.diagnosis.models import Incident
from console.inventory.models import Node
from tests.faults.conftest import cpu_deployment
from tests.faults.test_engine_crash import agent_events
from tests.kit import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.worker]


def ready(dep: str, version: int) -> int:
    return Replica.objects.filter(deployment__name=dep, state="ready", spec_version=version).count()


class Beat:
    """reconcile() once per poll, as the beat would, sampling the READY count after each."""

    def __init__(self, dep: str) -> None:
        self.dep, self.ready_seen = dep, []

    def __call__(self, done):
        def check():
            reconcile()
            self.ready_seen.append(
                Replica.objects.filter(deployment__name=self.dep, state="ready").count()
            )
            return done()

        return check


def _explain(agent) -> None:
    print("--- agent ---\n", agent.output()[-6000:])
    print("--- rollouts ---", list(Rollout.objects.values()))
    for r in Replica.objects.order_by("pk"):
        print(r.pk, r.index, r.state, r.spec_version, r.generation, r.state_reason)
        print("   ", list(r.events.values_list("to_state", "reason")))


def started(stand_in_agent, model_dir, name: str):
    agent = stand_in_agent(f"{name}-node")
    cpu_deployment(name, Node.objects.get(name=f"{name}-node"), model_dir, replicas=2)
    beat = Beat(name)
    wait_for(beat(lambda: ready(name, 1) == 2), 60, message="two replicas ready on v1")
    good = Deployment.objects.filter(name=name, good_version=1)
    wait_for(beat(good.exists), 10, message="v1 remembered as the last good spec")
    old = list(Replica.objects.filter(deployment__name=name).order_by("index"))
    return agent, beat, old


def test_rolling_restart_surges_one_at_a_time_and_stops_old_only_after_an_answer(
    console_worker, stand_in_agent, model_dir, admin_user
):
    agent, beat, old = started(stand_in_agent, model_dir, "roll")
    beat.ready_seen.clear()
    services.restart_deployment(actor=Actor(user=admin_user, name="ada"), name="roll")
    try:
        wait_for(
            beat(lambda: Rollout.objects.filter(deployment__name="roll", state="done").exists()),
            120,
            message="the rolling restart to finish",
        )
    except AssertionError:
        _explain(agent)
        raise
    assert min(beat.ready_seen) >= 2, beat.ready_seen  # never below `replicas` READY
    new = list(Replica.objects.filter(deployment__name="roll").order_by("index"))
    assert [(r.index, r.state, r.spec_version) for r in new] == [(0, "ready", 2), (1, "ready", 2)]
    assert not {r.pk for r in new} & {r.pk for r in old}  # surge replicas took their places
    output = agent.output()
    for replacement, gone in zip(new, old, strict=True):
        answered = ReplicaEvent.objects.get(
            replica=replacement, reason__startswith="answered a test completion"
        )
        assert "HTTP 200" in answered.reason  # a real completion, from the engine itself
        stops = [at for at, word in agent_events(output, gone.pk) if word.startswith("stop")]
        assert stops, output[-4000:]
        assert answered.at.timestamp() < stops[0]  # the old one stopped after the answer
    # the second surge replica started only once the first old replica had stopped
    first_stop = min(at for at, w in agent_events(output, old[0].pk) if w.startswith("stop"))
    second_start = min(at for at, _ in agent_events(output, new[1].pk))
    assert first_stop < second_start


def test_crash_looping_new_generation_rolls_back_and_ends_ready_on_the_old_spec(
    console_worker, stand_in_agent, model_dir
):
    agent, beat, old = started(stand_in_agent, model_dir, "bad")
    beat.ready_seen.clear()
    # a settings change whose engines die at start (what services.update_deployment writes,
    # minus the model inspection this test is not about)
    Deployment.objects.filter(name="bad").update(
        extra_env={"FAKE_CRASH_AFTER_S": "0.2"}, spec_version=2
    )
    try:
        wait_for(
            beat(
                lambda: Rollout.objects.filter(deployment__name="bad", state="rolled-back").exists()
            ),
            120,
            message="the crash-looping generation to be rolled back",
        )
    except AssertionError:
        _explain(agent)
        raise
    assert min(beat.ready_seen) >= 2, beat.ready_seen
    dep = Deployment.objects.get(name="bad")
    assert (dep.spec_version, dep.extra_env) == (1, {})  # the last good settings again
    wait_for(beat(lambda: ready("bad", 1) == 2), 30, message="both replicas ready on v1")
    assert [r.pk for r in Replica.objects.filter(deployment=dep).order_by("index")] == [
        r.pk for r in old
    ]
    ro = Rollout.objects.get(deployment=dep)
    assert "crash-loops on spec v2" in ro.reason
    incident = Incident.objects.get(category="rollout-failed")
    assert incident.status == "open" and "rolled back to v1" in incident.title
    journal = ReplicaEvent.objects.filter(replica=old[0], reason__contains="rolled back to spec v1")
    assert journal.exists()
