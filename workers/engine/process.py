"""Process-level helpers: spawn an engine in its own process group, find every process of
that group, end them all (SIGTERM, grace, SIGKILL), and check a port.

A process is identified by (pid, create_time), never by pid alone, so a reused pid is never
taken for the engine. Zombies count as gone: they hold no memory, no device and no port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

_CLOCK_SLACK_S = 1.0  # create_time is in clock ticks; children can read as a bit "older"


def spawn(argv: list[str], env: Mapping[str, str], log_fd: int, cwd: Path) -> subprocess.Popen:
    """Start argv as the leader of a new session (so of a new process group), its stdout and
    stderr going straight to log_fd. Raises OSError when it cannot be started."""
    return subprocess.Popen(
        argv,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def matching_process(pid: int | None, created: float | None) -> psutil.Process | None:
    """The live process with this pid AND this create time, or None."""
    if not pid or created is None:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - created) > 0.05 or not _alive(proc):
            return None
        return proc
    except psutil.Error:
        return None


def descendants(pid: int | None, created: float | None) -> list[psutil.Process]:
    """The live children (recursively) of the matching process; [] when it is gone."""
    proc = matching_process(pid, created)
    if proc is None:
        return []
    try:
        return [p for p in proc.children(recursive=True) if _alive(p)]
    except psutil.Error:
        return []


def group_members(pgid: int, since: float | None) -> list[psutil.Process]:
    """Live processes of process group `pgid` started no earlier than `since` (the leader's
    create time: a younger group with a reused id is not ours)."""
    members = []
    for proc in psutil.process_iter(["create_time", "status"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except OSError:
            continue
        if since is None or (proc.info["create_time"] or 0) >= since - _CLOCK_SLACK_S:
            members.append(proc)
    return members


def signal_group(pgid: int, sig: int, extra: list[psutil.Process]) -> None:
    """Send sig to the whole group, and to `extra` processes still alive. Never raises."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in extra:  # descendants that left the group (setsid) still get the signal
        try:
            if _alive(proc):
                proc.send_signal(sig)
        except psutil.Error:
            pass


def left_in_group(
    pgid: int, since: float | None, extra: list[psutil.Process]
) -> list[psutil.Process]:
    """Live members of the group plus live `extra` processes."""
    found = {p.pid: p for p in group_members(pgid, since)}
    found.update({p.pid: p for p in extra if _alive(p)})
    return list(found.values())


def wait_gone(
    pgid: int,
    since: float | None,
    extra: list[psutil.Process],
    timeout: float,
    reap: Callable[[], object] | None = None,
) -> bool:
    """Poll until no process of the group (nor of `extra`) is left; False at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if reap is not None:
            reap()
        if not left_in_group(pgid, since, extra):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def terminate_group(
    pgid: int,
    since: float | None,
    grace_s: float,
    extra: list[psutil.Process] | None = None,
    reap: Callable[[], object] | None = None,
) -> str:
    """End every process of the group (and `extra`): SIGTERM, wait grace_s, then SIGKILL.
    Blocks until they are gone. Returns "gone" (nothing was running), "sigterm", "sigkill", or
    "survived" (still there 10 s after SIGKILL, e.g. stuck in the kernel on a device)."""
    extra = list(extra or [])
    if reap is not None:
        reap()
    if not left_in_group(pgid, since, extra):
        return "gone"
    signal_group(pgid, signal.SIGTERM, extra)
    if wait_gone(pgid, since, extra, grace_s, reap):
        return "sigterm"
    signal_group(pgid, signal.SIGKILL, extra)
    if wait_gone(pgid, since, extra, 10.0, reap):
        return "sigkill"
    return "survived"


def kill_group_now(pgid: int, since: float | None) -> int:
    """SIGKILL what is left of a group whose leader already died (its orphaned workers).
    Does not wait. Returns how many processes were signalled."""
    left = group_members(pgid, since)
    if left:
        signal_group(pgid, signal.SIGKILL, left)
    return len(left)


def port_in_use(host: str, port: int) -> bool:
    """True when a server could not bind (host, port) now. SO_REUSEADDR like vLLM's own
    server, so connections in TIME_WAIT from a stopped engine do not count."""
    address = host or "0.0.0.0"  # noqa: S104 - a bind test, closed at once
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.strip("[]"), port))
        except OSError:
            return True
    return False


def wait_port_free(host: str, port: int, timeout: float) -> bool:
    """Poll the bind test until the port is free; False at the deadline."""
    deadline = time.monotonic() + timeout
    while port_in_use(host, port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def uses_port(proc: psutil.Process, port: int) -> bool:
    """True when the process or one of its children listens on, or is connected from, port."""
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return False
    for member in family:
        try:
            connections = member.net_connections(kind="inet")
        except psutil.Error:
            continue
        if any(c.laddr and c.laddr.port == port for c in connections):
            return True
    return False


def describe_exit(returncode: int | None) -> tuple[int | None, int | None, str]:
    """(exit_code, signal, words) for a Popen returncode (negative = killed by a signal)."""
    if returncode is None:
        return None, None, "exit code unknown"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return None, -returncode, f"killed by signal {-returncode} ({name})"
    return returncode, None, f"exited with code {returncode}"
