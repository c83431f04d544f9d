"""run_tool: vendor tools under a hard time limit, and none outliving an exiting agent."""

from __future__ import annotations

import sys
import threading
import time

import psutil
import pytest

from workers.accelerators import process
from workers.accelerators.process import kill_running_tools, run_tool


@pytest.fixture
def reopen(monkeypatch):
    """kill_running_tools() closes the module for good (the agent is exiting); undo that for
    the next test in this process."""
    monkeypatch.setattr(process, "_closing", False)
    yield
    monkeypatch.setattr(process, "_closing", False)


def test_a_hanging_tool_is_killed_at_its_timeout():
    t0 = time.monotonic()
    run = run_tool([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert run.error == f"{sys.executable.rsplit('/', 1)[-1]} timed out after 0.5s"
    assert time.monotonic() - t0 < 3


def test_an_exiting_agent_kills_the_tool_in_flight_and_starts_no_more(reopen):
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    result = {}
    probe = threading.Thread(target=lambda: result.update(run=run_tool(argv, timeout=60)))
    probe.start()
    deadline = time.monotonic() + 10
    while not process._running and time.monotonic() < deadline:
        time.sleep(0.01)
    (tool,) = list(process._running)
    assert kill_running_tools() == 1
    probe.join(5)
    assert not probe.is_alive() and result["run"].returncode != 0
    assert not psutil.pid_exists(tool.pid) or psutil.Process(tool.pid).status() == "zombie"
    late = run_tool(argv, timeout=60)  # a probe thread that had not seen the stop yet
    assert late.error and "agent is exiting" in late.error
    assert not process._running
