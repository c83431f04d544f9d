"""The agent picks its engine runner from its accelerators: simulated NPUs get simulated
engines (no process, labelled SIMULATED, reported through the agent's own channel); any other
agent runs the real engine."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from tests.workers.engine.helpers import free_port, wait_for
from workers.agent import Agent, command_handlers, simulated_node
from workers.channel import Identity
from workers.config import AgentConfig
from workers.contracts import EnginePhase, EngineReport, Tasks
from workers.engine import simulated


@pytest.fixture(scope="session", autouse=True)
def redis_url() -> None:
    """Overrides tests/conftest.py's Redis: these agents send through a stand-in."""
    return None


def make_agent(tmp_path: Path, **env: str) -> tuple[Agent, list[EngineReport]]:
    """An agent on a broker it never reaches; its engine reports are kept in a list."""
    config = AgentConfig.from_env(
        {
            "NPU_AGENT_BROKER_URL": "redis://127.0.0.1:1/0",
            "NPU_AGENT_NODE_NAME": "node-1",
            "NPU_AGENT_STATE_DIR": str(tmp_path / "agent"),
            "NPU_AGENT_ENGINE_PROBE_S": "0.05",
            **env,
        }
    )
    agent = Agent(config, Identity(node="node-1", kid=1, key_hex="00" * 32))
    sent: list[EngineReport] = []

    def send(kind: str, body: dict) -> None:
        if kind == Tasks.ENGINE_REPORT:
            sent.append(EngineReport.model_validate(body))

    agent.send = send  # what send_engine_report (the supervisor's callback) calls
    return agent, sent


def spec(tmp_path: Path, **fields) -> dict:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    values = {
        "replica_id": 7,
        "generation": 1,
        "node": "node-1",
        "deployment": "tiny",
        "model_path": str(model),
        "served_model_name": "tiny",
        "port": free_port(),
        "npu_ids": [0],
    }
    return values | fields


def test_an_agent_with_simulated_npus_simulates_its_engines(tmp_path, monkeypatch):
    monkeypatch.setitem(simulated.PHASE_S, EnginePhase.STARTING, 0.05)
    monkeypatch.setitem(simulated.PHASE_S, EnginePhase.LOADING, 0.05)
    agent, sent = make_agent(tmp_path, NPU_AGENT_PROVIDERS="simulated")
    assert simulated_node(agent.config) and agent.supervisor.simulated
    handlers = command_handlers(agent)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        handlers[Tasks.HOST_START_REPLICA](spec(tmp_path))
        wait_for(lambda: any(r.phase == EnginePhase.READY for r in sent), 5, "ready")
        assert not {p.pid for p in psutil.Process().children(recursive=True)} - before
        assert [r.phase for r in sent] == ["starting", "loading", "ready"]
        assert all(r.reason.startswith("SIMULATED") and r.pid is None for r in sent)
        (beat,) = agent.supervisor.reports()  # what the heartbeats carry
        assert beat.phase == EnginePhase.READY and beat.reason.startswith("SIMULATED")
        handlers[Tasks.HOST_STOP_REPLICA](7, 1)
        assert [r.phase for r in sent[-2:]] == ["stopping", "stopped"]
    finally:
        agent.supervisor.shutdown()


def test_an_agent_without_simulated_npus_runs_the_real_engine(tmp_path):
    """The real runner starts the engine's interpreter (here a stand-in that prints its argv
    and exits) as `python -m vllm…`: a real process, no simulation, no SIMULATED label."""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "stand-in interpreter: $*"\nexit 3\n')
    python.chmod(0o755)
    agent, sent = make_agent(tmp_path, NPU_AGENT_ENGINE_PYTHON=str(python))
    assert not simulated_node(agent.config) and not agent.supervisor.simulated
    handlers = command_handlers(agent)
    try:
        handlers[Tasks.HOST_START_REPLICA](spec(tmp_path, device="cpu"))
        started = sent[0]
        assert started.phase == EnginePhase.STARTING and started.pid is not None
        assert "SIMULATED" not in started.reason
        log = Path(started.log_path)
        wait_for(lambda: "-m vllm.entrypoints.openai.api_server" in log.read_text(), 5, "argv")
        assert "SIMULATED" not in log.read_text()
    finally:
        handlers[Tasks.HOST_STOP_REPLICA](7, 1)
        agent.supervisor.shutdown()


def test_a_ping_answer_carries_when_the_agent_read_it_and_answered(tmp_path, monkeypatch):
    """The agent's half of the console's NTP-style clock-skew check (contracts.ClockReading):
    t1 stamped by the command loop on reading the command, t2 on answering, both from the
    agent's own clock."""
    from workers import agent as agent_mod
    from workers.agent import run_command
    from workers.contracts import ClockReading

    agent, _ = make_agent(tmp_path)
    replies: list = []
    monkeypatch.setattr(agent.channel, "reply", lambda command, result: replies.append(result))
    monkeypatch.setattr(agent_mod, "wall_clock", lambda: 1000.25)
    command = {"k": Tasks.HOST_PING, "a": ["clock"], "id": "c1", "r": True, "received_at": 999.5}
    run_command(agent, command_handlers(agent), command)
    reading = ClockReading.model_validate(replies[0])
    assert (reading.received_at, reading.replied_at) == (999.5, 1000.25)
    assert replies[0]["pong"] == "clock"
