"""The test kit: one of each thing many tests need. tests/README.md says what each is for.

from tests.kit import FakeEngine, closed_port, make_deployment, start_agent, wait_for
"""

from __future__ import annotations

from tests.kit.agents import start_agent
from tests.kit.api import post_deployment
from tests.kit.factories import make_deployment, make_node, make_replica
from tests.kit.fake_engine import FakeEngine, install_as_vllm
from tests.kit.ports import closed_port, free_port, on_free_port, silent_server
from tests.kit.processes import REPO, Proc, child_env, database_url, kill_engines_of
from tests.kit.waiting import wait_for

__all__ = [
    "REPO",
    "FakeEngine",
    "Proc",
    "child_env",
    "closed_port",
    "database_url",
    "free_port",
    "install_as_vllm",
    "kill_engines_of",
    "make_deployment",
    "make_node",
    "make_replica",
    "on_free_port",
    "post_deployment",
    "silent_server",
    "start_agent",
    "wait_for",
]
