"""Engine supervision on a host: build the vLLM command, run it, watch it, read its logs.

The agent creates one `Supervisor` (see supervisor.py) and calls it from its Celery tasks.
Nothing here imports Django; only the standard library, psutil and pydantic (the contract).

The names below are loaded on first use (PEP 562), not when the package is imported:
workers/contracts.py imports workers.engine.group (EngineSpec.group), and an eager import of
argv.py here would import workers.contracts back before it has defined EngineSpec.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "Supervisor": "supervisor",
    "build_argv": "argv",
    "build_env": "argv",
    "cann_environment": "argv",
    "redact_argv": "argv",
    "redact_env": "argv",
    "inspect_model": "inspect",
    "read_log": "logs",
    "tail_lines": "logs",
    "probe_health": "probes",
    "probe_models": "probes",
    "scrape_metrics": "probes",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
