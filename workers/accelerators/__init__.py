"""Accelerator providers of the host agent (standard library + psutil only).

probe_all() is what the CLI's `probe` prints and what the heartbeat sends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .ascend import AscendProvider
from .base import NpuChip, NpuProcess, NpuSmiReport, ParseError, Provider, ProviderResult
from .host import host_metrics
from .nvidia import NvidiaProvider
from .simulated import SimulatedProvider
from .versions import detect_versions

DEFAULT_PROVIDERS = ("ascend", "nvidia")

__all__ = [
    "AscendProvider",
    "NpuChip",
    "NpuProcess",
    "NpuSmiReport",
    "NvidiaProvider",
    "ParseError",
    "Provider",
    "ProviderResult",
    "SimulatedProvider",
    "default_providers",
    "detect_versions",
    "host_metrics",
    "probe_all",
]


def _setting(config: Any, name: str, default: Any) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def default_providers(config: Any = None) -> list[Provider]:
    """Fresh providers for this host, in config order.

    `config` is a workers.config.AgentConfig, a mapping with the same names, or None.
    Read: providers (names among "ascend", "nvidia", "simulated"; default ascend and
    nvidia), npu_smi, npu_smi_timeout_s (also used for nvidia-smi), nvidia_smi, and for
    the simulated provider sample_path and seed. Raises ValueError for an unknown name.
    """
    names = tuple(_setting(config, "providers", DEFAULT_PROVIDERS))
    timeout = float(_setting(config, "npu_smi_timeout_s", 10.0))
    factories: dict[str, Callable[[], Provider]] = {
        "ascend": lambda: AscendProvider(_setting(config, "npu_smi", "npu-smi"), timeout),
        "nvidia": lambda: NvidiaProvider(_setting(config, "nvidia_smi", "nvidia-smi"), timeout),
        "simulated": lambda: SimulatedProvider(
            _setting(config, "sample_path", None), seed=_setting(config, "seed", None)
        ),
    }
    unknown = [name for name in names if name not in factories]
    if unknown:
        raise ValueError(f"unknown accelerator provider(s): {', '.join(unknown)}")
    return [factories[name]() for name in names]


def probe_all(
    simulated: bool = False,
    config: Any = None,
    providers: Sequence[Provider] | None = None,
) -> dict[str, Any]:
    """Everything this host reports right now, JSON-serialisable.

    Keys: collected_at (Unix time), host, versions, then one key per provider name
    ("ascend", "nvidia" by default; "simulated" only when asked). Pass long-lived
    `providers` from a heartbeat loop (AscendProvider caches its id mapping); otherwise
    they are built from `config`, plus the simulated one when `simulated`. Providers run
    one after the other: the worst case is the sum of their timeouts. Never raises for
    an absent or broken vendor tool.
    """
    if providers is None:
        providers = default_providers(config)
        if simulated and not any(p.name == "simulated" for p in providers):
            providers.append(SimulatedProvider())
    result: dict[str, Any] = {
        "collected_at": time.time(),
        "host": host_metrics(_setting(config, "disk_paths", ("/",))),
        "versions": detect_versions(python=_setting(config, "engine_python", None) or None),
    }
    for provider in providers:
        result[provider.name] = provider.probe().to_dict()
    return result
