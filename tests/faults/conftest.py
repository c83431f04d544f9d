"""Fixtures for the fault-injection tests (marker `faults`): real agents, console workers,
brokers and engine processes, broken on purpose. docs/faults.md lists each promise and the
test that proves it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from console.accounts.services import Actor
from console.deployments.models import Deployment
from console.inventory.enrollment import create_enrollment_token
from console.inventory.models import Node
from tests.kit import Proc, install_as_vllm, kill_engines_of, make_deployment, start_agent, wait_for

PROBE_S = 1.0  # the agents' engine probe interval in these tests
BACKOFF_S = 0.5  # their first restart delay (doubles per crash)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A model directory the stand-in engine "serves" (config.json only)."""
    path = tmp_path / "stand-in-model"
    path.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def stand_in_agent(
    redis_url, admin_user, tmp_path: Path, model_dir: Path
) -> Iterator[Callable[..., Proc]]:
    """start(name, argv_prefix=(), **env) -> a real agent process (tests.kit.start_agent)
    whose engines are the kit's fake vLLM (tests/kit/fake_engine.py, run as a process), with
    fast probes and backoff; waits until its node is registered. Every agent and engine it
    started is killed at teardown."""
    fake = install_as_vllm(tmp_path / "fake-vllm")
    _, token = create_enrollment_token(actor=Actor(user=admin_user, name="ada"), name="faults")
    started: list[Proc] = []

    def start(name: str, argv_prefix=(), **env: str) -> Proc:
        settings = {
            "PYTHONPATH": str(fake),
            "NPU_AGENT_ENGINE_PROBE_S": str(PROBE_S),
            "NPU_AGENT_ENGINE_BACKOFF_S": str(BACKOFF_S),
            **env,
        }
        agent = start_agent(
            redis_url,
            token,
            tmp_path,
            name=name,
            engine_python=sys.executable,
            argv_prefix=argv_prefix,
            **settings,
        )
        started.append(agent)
        wait_for(
            lambda: Node.objects.filter(name=name, status="online").exists() or _exited(agent),
            60,
            message=f"node {name} to enroll and beat",
        )
        return agent

    yield start
    for agent in started:
        agent.stop()
    kill_engines_of(str(model_dir))


def _exited(agent: Proc) -> bool:
    if agent.popen.poll() is not None:
        raise AssertionError(f"the agent exited:\n{agent.output()[-4000:]}")
    return False


def cpu_deployment(name: str, node: Node, model_dir: Path, replicas: int = 1) -> Deployment:
    """A running CPU deployment pinned to `node` (written directly: the API's model inspection
    is not what these tests are about)."""
    return make_deployment(
        name,
        model_path=str(model_dir),
        served_model_name="tiny",
        device="cpu",
        pinned_node=node,
        replicas=replicas,
        desired_state="running",
        spec_version=1,
    )
