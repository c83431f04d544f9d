"""One way to start a real host agent in a test."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from tests.kit.processes import Proc, child_env


def start_agent(
    redis_url: str,
    token: str,
    tmp_path: Path,
    *,
    name: str,
    simulated: bool = False,
    engine_python: Path | str | None = None,
    state_dir: Path | None = None,
    argv_prefix: Sequence[str] = (),
    **env: str,
) -> Proc:
    """A real host agent process (`python -m workers agent --node-name <name>`), enrolling
    with `token` through the test Redis and beating every second. Returns at once: wait for
    its node yourself, and stop() it (it runs in its own process group).

    simulated: replayed npu-smi captures instead of the host's accelerators (--simulated).
    engine_python: the python that runs its vLLM engines (NPU_AGENT_ENGINE_PYTHON).
    state_dir: its identity and engine state; <tmp_path>/agent-state by default, so an agent
    started again in the same test keeps its credential and re-adopts its engines.
    argv_prefix: a command that wraps it (e.g. `unshare ... sh -c '...' "$@"`).
    env: NPU_AGENT_* settings (or anything else) added or overridden.
    Its output goes to <tmp_path>/agent-<name>-<n>.log, one file per start.
    """
    settings = {
        "NPU_AGENT_ENROLL_TOKEN": token,
        "NPU_AGENT_HEARTBEAT_S": "1",
        "NPU_AGENT_BROKER_URL": redis_url,
        "NPU_AGENT_STATE_DIR": str(state_dir or tmp_path / "agent-state"),
    }
    if engine_python is not None:
        settings["NPU_AGENT_ENGINE_PYTHON"] = str(engine_python)
    argv = [*argv_prefix, sys.executable, "-m", "workers", "agent"]
    argv += ["--simulated"] if simulated else []
    argv += ["--node-name", name]
    log = tmp_path / f"agent-{name}-{len(list(tmp_path.glob(f'agent-{name}-*.log')))}.log"
    return Proc(argv, child_env(redis_url, **{**settings, **env}), log)
