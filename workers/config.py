"""The host agent's own small configuration, from NPU_AGENT_* environment variables."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# The checkout the agent runs from (`make run`, `python -m workers agent` in a clone): where
# `make engine-env` puts the engine environment. In an installed package this is site-packages,
# where no .venv-engine/ exists, so the default below simply does not apply there.
CHECKOUT = Path(__file__).resolve().parent.parent
DEFAULT_ENGINE_VENV = ".venv-engine"


class ConfigError(ValueError):
    pass


def default_node_name() -> str:
    """The hostname as a DNS label: lowercase, [a-z0-9-], at most 63 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().split(".")[0].lower()).strip("-")
    return (name or "node")[:63].strip("-")


def _positive(env: dict[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, default))
    except ValueError:
        raise ConfigError(f"{name}: expected a number of seconds, got {env.get(name)!r}") from None
    if value <= 0:
        raise ConfigError(f"{name}: must be > 0")
    return value


def engine_host_from_env(env: dict[str, str]) -> str | None:
    """NPU_AGENT_ENGINE_HOST: the address NPU engines bind to (the data-plane network the
    console reaches them on), overriding the spec's; None when unset. An IP address only."""
    value = (env.get("NPU_AGENT_ENGINE_HOST") or "").strip()
    if not value:
        return None
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise ConfigError(
            f"NPU_AGENT_ENGINE_HOST: {value!r} is not an IP address (e.g. 10.20.0.5)"
        ) from None


def _interpreter(path: Path) -> bool:
    return shutil.which(str(path)) is not None  # an executable file; a bare name: on PATH


def engine_python_from_env(
    env: Mapping[str, str], *, checkout: Path = CHECKOUT, own: str = sys.executable
) -> tuple[str, str]:
    """The interpreter engines run under (the engine environment: vLLM, and on Ascend hosts
    vllm-ascend + torch-npu), and why that one, as (path, source). The first that applies:

    1. NPU_AGENT_ENGINE_PYTHON;
    2. $ENGINE_VENV/bin/python (the variable `make engine-env` takes; relative to the checkout);
    3. <checkout>/.venv-engine/bin/python, when it exists (what `make engine-env` makes);
    4. the agent's own interpreter (an engine env that is the agent's venv).

    A variable that is set but names no interpreter is a ConfigError: a typo must not quietly
    fall back to an interpreter without vLLM, where every engine would fail to start."""
    explicit = (env.get("NPU_AGENT_ENGINE_PYTHON") or "").strip()
    if explicit:
        if not _interpreter(Path(explicit)):
            raise ConfigError(f"NPU_AGENT_ENGINE_PYTHON: {explicit} is not an executable")
        return explicit, "NPU_AGENT_ENGINE_PYTHON"
    venv = (env.get("ENGINE_VENV") or "").strip()
    if venv:
        python = checkout / venv / "bin" / "python"  # an absolute ENGINE_VENV replaces checkout
        if not _interpreter(python):
            raise ConfigError(f"ENGINE_VENV: no {python} (create it: make engine-env)")
        return str(python), "ENGINE_VENV"
    python = checkout / DEFAULT_ENGINE_VENV / "bin" / "python"
    if _interpreter(python):
        return str(python), f"this checkout's {DEFAULT_ENGINE_VENV}/, made by make engine-env"
    return own, "the agent's own interpreter (no engine env found)"


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    broker_url: str
    enroll_token: str
    heartbeat_s: float = 5.0
    providers: tuple[str, ...] = ("ascend", "nvidia")
    npu_smi: str = "npu-smi"
    npu_smi_timeout_s: float = 10.0
    hccn_tool: str = "hccn_tool"  # NPU network checks; see workers/accelerators/hccn.py
    state_dir: Path = field(default_factory=lambda: Path.home() / ".npu-agent")
    sample_path: str | None = None  # simulated provider: which real capture to replay
    engine_python: str = ""  # the interpreter of the engine environment (vLLM); "" = this one
    engine_python_source: str = ""  # why that interpreter (engine_python_from_env), for the log
    engine_start_timeout_s: float = 900.0  # vLLM listens only after loading weights
    engine_probe_s: float = 2.0  # how often the supervisor looks at each engine
    engine_backoff_s: float = 2.0  # first restart delay after a crash (doubles each crash)
    cann_set_env: str = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
    engine_host: str | None = None  # NPU engines bind here instead of the spec's host

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AgentConfig:
        env = dict(os.environ if env is None else env)
        broker = env.get("NPU_AGENT_BROKER_URL") or env.get("REDIS_URL", "")
        if not broker:
            raise ConfigError(
                "NPU_AGENT_BROKER_URL: not set (the console's Redis, e.g. redis://host:6379/0)"
            )
        broker = broker.replace("unix://", "redis+socket://", 1)
        name = env.get("NPU_AGENT_NODE_NAME") or default_node_name()
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", name):
            raise ConfigError(f"NPU_AGENT_NODE_NAME: {name!r} is not a DNS label ([a-z0-9-], 1-63)")
        try:
            heartbeat = float(env.get("NPU_AGENT_HEARTBEAT_S", "5"))
            timeout = float(env.get("NPU_SMI_TIMEOUT_S", "10"))
        except ValueError as exc:
            raise ConfigError(f"NPU_AGENT_HEARTBEAT_S / NPU_SMI_TIMEOUT_S: {exc}") from None
        if heartbeat <= 0:
            raise ConfigError("NPU_AGENT_HEARTBEAT_S: must be > 0")
        providers = tuple(
            p.strip()
            for p in env.get("NPU_AGENT_PROVIDERS", "ascend,nvidia").split(",")
            if p.strip()
        )
        unknown = set(providers) - {"ascend", "nvidia", "simulated"}
        if unknown:
            raise ConfigError(
                f"NPU_AGENT_PROVIDERS: unknown provider(s) {', '.join(sorted(unknown))}"
            )
        engine_python, engine_python_source = engine_python_from_env(env)
        return cls(
            node_name=name,
            broker_url=broker,
            enroll_token=env.get("NPU_AGENT_ENROLL_TOKEN", ""),
            heartbeat_s=heartbeat,
            providers=providers,
            npu_smi=env.get("NPU_SMI_PATH", "npu-smi"),
            npu_smi_timeout_s=timeout,
            hccn_tool=env.get("HCCN_TOOL_PATH", "hccn_tool"),
            state_dir=Path(env.get("NPU_AGENT_STATE_DIR") or Path.home() / ".npu-agent"),
            sample_path=env.get("NPU_AGENT_SIM_SAMPLE") or None,
            engine_python=engine_python,
            engine_python_source=engine_python_source,
            engine_start_timeout_s=_positive(env, "NPU_AGENT_ENGINE_START_TIMEOUT_S", 900.0),
            engine_probe_s=_positive(env, "NPU_AGENT_ENGINE_PROBE_S", 2.0),
            engine_backoff_s=_positive(env, "NPU_AGENT_ENGINE_BACKOFF_S", 2.0),
            cann_set_env=env.get(
                "NPU_AGENT_CANN_SET_ENV", "/usr/local/Ascend/ascend-toolkit/set_env.sh"
            ),
            engine_host=engine_host_from_env(env),
        )
