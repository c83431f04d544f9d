"""What the console sends an agent about an engine: settings at their default are left out
(an agent one minor version older takes the spec), and what a host says back about its engine
reaches the database without terminal escape sequences."""

from __future__ import annotations

from datetime import UTC, datetime

from console.accounts.services import Actor
from console.deployments import engines, services
from console.deployments.models import Replica
from console.deployments.reconcile import reconcile
from console.deployments.schemas import DeploymentIn
from tests.console.deployments.test_report_order import send
from tests.console.deployments.test_scheduling import SPEC
from tests.factories import make_node
from workers.contracts import EngineSpec


def _one_replica(operator, monkeypatch, **spec) -> Replica:
    monkeypatch.setattr("console.deployments.reconcile.dispatch_start", lambda r: None)
    actor = Actor(user=operator, name="otto")
    make_node("a", npus=4)
    services.create_deployment(
        actor=actor, payload=DeploymentIn(name="d1", **SPEC | {"replicas": 1} | spec)
    )
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    return Replica.objects.get()


def _sent(replica: Replica, monkeypatch) -> dict:
    sent = []
    monkeypatch.setattr(engines, "send_on_commit", lambda node, task, args: sent.append(args[0]))
    engines.dispatch_start(replica)
    (payload,) = sent
    return payload


def test_settings_at_their_default_are_left_out_of_the_start_command(
    operator, fake_inspect, monkeypatch
):
    replica = _one_replica(operator, monkeypatch)
    payload = _sent(replica, monkeypatch)
    assert "allocator" not in payload  # added in this release: an older agent lacks it
    assert "max_num_seqs" not in payload  # unset: vLLM's own default
    # the agent's EngineSpec fills the same defaults: the spec it builds is the one meant
    assert EngineSpec.model_validate(payload) == engines.build_spec(replica)


def test_a_setting_in_use_is_sent(operator, fake_inspect, monkeypatch):
    replica = _one_replica(operator, monkeypatch, max_num_seqs=32)
    assert _sent(replica, monkeypatch)["max_num_seqs"] == 32


def test_an_engine_failure_reason_is_stored_without_escape_sequences(
    operator, fake_inspect, monkeypatch
):
    replica = _one_replica(operator, monkeypatch)
    now = datetime.now(UTC)
    send(replica, "starting", now)
    send(
        replica,
        "failed",
        now,
        reason="\x1b[31mexit 1\x1b[0m \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"
        "\x1b]52;c;ZXZpbA==\x07\x9b2J",
    )
    replica.refresh_from_db()
    assert replica.state == "failed"
    assert "\x1b" not in replica.state_reason and "\x9b" not in replica.state_reason
    assert "\x07" not in replica.state_reason
    assert "exit 1" in replica.state_reason and "evil.example" not in replica.state_reason
