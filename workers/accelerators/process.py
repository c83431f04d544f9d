"""Run a vendor tool (npu-smi, nvidia-smi) with a hard time limit.

The tool runs from an argv list (never a shell), in its own session so that on timeout
the whole process group is killed: a wrapper script's children cannot keep the pipes
open and make the caller hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass

_running: set[subprocess.Popen[bytes]] = set()  # tools in flight, for kill_running_tools()
_running_lock = threading.Lock()  # held while a tool starts: no start slips past the kill
_closing = False  # set by kill_running_tools(): the agent is exiting, start nothing more


@dataclass(slots=True)
class ToolRun:
    """Outcome of one run. `error` is set (and returncode None) when the tool could
    not be started or was killed on timeout."""

    command: str  # tool name and arguments, for messages: "npu-smi info -m"
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None

    def failure(self) -> str | None:
        """One line saying why the run is unusable, or None if it exited 0."""
        if self.error is not None:
            return self.error
        if self.returncode == 0:
            return None
        detail = first_line(self.stderr) or first_line(self.stdout) or "no output"
        return f"{self.command} exited with status {self.returncode}: {detail}"


def first_line(text: str) -> str:
    """The first non-blank line of text, stripped ('' if none)."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def run_tool(argv: Sequence[str], timeout: float, label: str | None = None) -> ToolRun:
    """Run argv, wait at most `timeout` seconds, never raise for tool problems.

    `label` names the command in messages (default: tool name and arguments).

    Guarantees: returns within about timeout + 1 s; a timed-out tool and its process
    group are sent SIGKILL; output is decoded as UTF-8 with replacement.
    """
    tool = os.path.basename(argv[0])
    command = label or " ".join([tool, *argv[1:]])
    # Started and registered under the lock kill_running_tools() takes: a tool is either
    # started before the agent's exit and killed with the others, or never started.
    with _running_lock:
        if _closing:
            return ToolRun(command, None, error=f"{tool} not run: the agent is exiting")
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError:
            where = "on PATH" if argv[0] == tool else f"at {argv[0]}"
            return ToolRun(command, None, error=f"{tool} not found {where}")
        except OSError as exc:
            return ToolRun(command, None, error=f"{tool} could not be started: {exc}")
        _running.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return ToolRun(command, None, error=f"{tool} timed out after {timeout:g}s")
    finally:
        with _running_lock:
            _running.discard(proc)
    return ToolRun(command, proc.returncode, _decode(out), _decode(err))


def kill_running_tools() -> int:
    """The agent is exiting: SIGKILL the process group of every tool still running (a hung
    npu-smi in its own session would otherwise outlive it) and start no tool from now on (a
    probe thread that has not seen the stop yet would leave one behind). Returns how many."""
    global _closing
    with _running_lock:
        _closing = True
        procs = list(_running)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return len(procs)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:
        # A grandchild left the group and still holds a pipe: stop reading.
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        proc.wait()


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")
