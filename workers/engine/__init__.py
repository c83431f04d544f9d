"""Engine supervision on a host: build the vLLM command, run it, watch it, read its logs.

The agent creates one `Supervisor` (see supervisor.py) and calls it from its Celery tasks.
Nothing here imports Django; only the standard library, psutil and pydantic (the contract).
"""

from __future__ import annotations

from workers.engine.argv import build_argv, build_env, cann_environment, redact_argv, redact_env
from workers.engine.inspect import inspect_model
from workers.engine.logs import read_log, tail_lines
from workers.engine.probes import probe_health, probe_models, scrape_metrics
from workers.engine.supervisor import Supervisor

__all__ = [
    "Supervisor",
    "build_argv",
    "build_env",
    "cann_environment",
    "inspect_model",
    "probe_health",
    "probe_models",
    "read_log",
    "redact_argv",
    "redact_env",
    "scrape_metrics",
    "tail_lines",
]
