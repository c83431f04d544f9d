"""Fixtures for the engine supervisor tests: a fake vLLM on PYTHONPATH, a model directory,
free ports, supervisors that clean up every process they started. No Django, no Redis."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.kit import free_port, install_as_vllm
from tests.workers.engine.helpers import Reports
from workers.contracts import EngineSpec
from workers.engine.supervisor import Supervisor

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session", autouse=True)
def redis_url() -> None:
    """Overrides tests/conftest.py's autouse Redis + Django settings fixture: these tests use
    neither, so they also run with `-p no:django`."""
    return None


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    """A directory that makes `python -m vllm.entrypoints.openai.api_server` the kit's fake
    engine (tests/kit/fake_engine.py)."""
    return install_as_vllm(tmp_path / "fake-vllm")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "tiny-llama"
    path.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture
def spec(model_dir: Path) -> Callable[..., EngineSpec]:
    """make(**fields) -> an EngineSpec for the fake on a free port (cpu device)."""

    def make(**fields) -> EngineSpec:
        values = dict(
            replica_id=1,
            generation=1,
            deployment="tiny",
            model_path=str(model_dir),
            served_model_name="tiny",
            host="127.0.0.1",
            port=free_port(),
            device="cpu",
            restart_max=3,
            restart_window_s=60,
        )
        values.update(fields)
        return EngineSpec(**values)

    return make


def _kill_leftovers(state_dir: Path, pids: set[int]) -> None:
    for path in state_dir.glob("engines/*/state.json"):
        pid = json.loads(path.read_text()).get("pid")
        if pid:
            pids.add(pid)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def reports() -> Reports:
    return Reports()


@pytest.fixture
def supervisor(
    tmp_path: Path, fake_vllm: Path, reports: Reports
) -> Iterator[Callable[..., Supervisor]]:
    """make(**overrides) -> a Supervisor running the fake with fast test timings. At teardown
    every supervisor is shut down and every engine group it started is SIGKILLed."""
    made: list[Supervisor] = []
    state_dir = tmp_path / "state"
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(fake_vllm),
        "HF_TOKEN": "hf_secret_never_logged",  # not allow-listed: never reaches the engine
        "VLLM_API_KEY": "vllm-secret-key",  # passed through (VLLM_*), redacted in the log
        "NPU_AGENT_ENROLL_TOKEN": "agent-secret",
    }

    def make(**overrides) -> Supervisor:
        options = dict(
            state_dir=state_dir,
            node="node-1",
            report=reports,
            python=sys.executable,
            probe_interval_s=0.05,
            stop_grace_s=1.0,
            backoff_base_s=0.1,
            backoff_max_s=1.0,
            cann_env={},
            base_env=base_env,
            port_free_timeout_s=5.0,
        )
        options.update(overrides)
        made.append(Supervisor(**options))
        return made[-1]

    yield make
    pids: set[int] = set()
    for sup in made:
        sup.shutdown()
        pids.update(r.pid for r in sup.reports() if r.pid)
    _kill_leftovers(state_dir, pids)
