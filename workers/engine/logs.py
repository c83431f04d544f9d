"""Engine log files: one per start, bounded in size, read by offset.

Layout: `<state_dir>/engines/<replica_id>/gen<generation>-run<n>.log`. The engine's stdout and
stderr are that file's descriptor (opened O_APPEND), so an engine never blocks on a pipe and
its log survives an agent restart.

Rotation is copy-truncate (like logrotate's `copytruncate`), not rename: the engine keeps its
descriptor for its whole life, so a renamed file would go on growing without bound. When the
file passes `max_bytes`, its bytes are copied to `<name>.1` (replacing the previous copy) and
the file is truncated; O_APPEND makes the engine's next write land at the new start (no sparse
hole). Bytes written in the instant between the last copy and the truncate are lost.

Offsets are logical: `<name>.base` holds how many bytes were cut from the start of the file,
so an offset keeps meaning the same byte across rotations. A reader whose offset points at
bytes no longer kept (older than `.1`) gets `overflow: True` and the oldest kept bytes.
Rotation and reads take the same per-file lock (both happen inside the agent process).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path
from typing import TypedDict

LOG_MAX_BYTES = 50 * 1024 * 1024
LOW_SPACE_BYTES = 64 * 1024 * 1024  # below this (or 1% of the disk) the log disk counts as full
LOG_KEEP = 5  # run logs kept per replica (each with at most one rotated copy)
READ_MAX_BYTES = 64 * 1024
_RUN_LOG = re.compile(r"^gen(\d+)-run(\d+)\.log$")
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


class LogChunk(TypedDict):
    text: str
    next_offset: int
    overflow: bool


def _lock(path: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(str(path), threading.Lock())


def replica_dir(state_dir: Path, replica_id: int) -> Path:
    """Where a replica's state file and logs live (not created here)."""
    return Path(state_dir) / "engines" / str(int(replica_id))


def run_log_path(directory: Path, generation: int, run: int) -> Path:
    return directory / f"gen{generation}-run{run}.log"


def rotated_path(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def _base_path(path: Path) -> Path:
    return path.with_name(path.name + ".base")


def open_for_engine(path: Path) -> int:
    """A write descriptor for a child's stdout/stderr (O_APPEND: see the module docstring).
    The caller closes it once the child holds its own copy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)


def space_problem(directory: Path) -> str | None:
    """Why engine logs under `directory` can no longer be written (its filesystem is full or
    nearly: under LOW_SPACE_BYTES or 1% free), or None. Never raises."""
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return None
    if usage.free >= min(LOW_SPACE_BYTES, usage.total // 100):
        return None
    return f"disk full at {directory}: {usage.free} of {usage.total} bytes free"


def _read_base(path: Path) -> int:
    try:
        return int(_base_path(path).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def rotate_if_needed(path: Path, max_bytes: int = LOG_MAX_BYTES) -> bool:
    """Copy-truncate `path` when it is larger than max_bytes. Returns True when it rotated."""
    if _size(path) <= max_bytes:
        return False
    with _lock(path):
        base = _read_base(path)
        tmp = path.with_name(path.name + ".1.tmp")
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
            copied = dst.tell()
            with open(path, "r+b") as trunc:
                # catch up with what arrived during the copy, then cut
                src.seek(copied)
                dst.write(src.read())
                copied = dst.tell()
                trunc.truncate(0)
        os.replace(tmp, rotated_path(path))
        base_tmp = path.with_name(path.name + ".base.tmp")
        base_tmp.write_text(str(base + copied))
        os.replace(base_tmp, _base_path(path))
    return True


def _read_at(path: Path, position: int, count: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            fh.seek(position)
            return fh.read(count)
    except OSError:
        return b""


def read_log(path: Path | str, offset: int = 0, max_bytes: int = READ_MAX_BYTES) -> LogChunk:
    """Up to max_bytes of text from logical `offset` (see the module docstring).

    offset < 0 means "the last max_bytes". A chunk cut by max_bytes ends at a line end when
    it holds one. `next_offset` is where the next read continues; `overflow` is True when
    bytes between `offset` and the returned text were lost to rotation (or the offset was
    beyond the end, e.g. a file from another run). Never raises for a missing file.
    """
    path = Path(path)
    max_bytes = max(1, int(max_bytes))
    with _lock(path):
        base, size = _read_base(path), _size(path)
        rotated = rotated_path(path)
        kept_from = base - _size(rotated) if base else base
        end = base + size
        overflow = False
        if offset < 0:
            offset = max(kept_from, end - max_bytes)
        elif offset < kept_from or offset > end:
            overflow, offset = True, kept_from
        if offset < base:
            data = _read_at(rotated, offset - kept_from, min(max_bytes, base - offset))
        else:
            data = _read_at(path, offset - base, max_bytes)
    if len(data) == max_bytes and b"\n" in data[:-1]:
        data = data[: data.rindex(b"\n") + 1]
    return {
        "text": data.decode("utf-8", errors="replace"),
        "next_offset": offset + len(data),
        "overflow": overflow,
    }


def _last_lines(path: Path, n: int) -> list[str]:
    size = _size(path)
    want = min(size, max(64 * 1024, n * 1024))
    data = _read_at(path, size - want, want)
    lines = data.decode("utf-8", errors="replace").splitlines()
    if want < size and lines:
        lines = lines[1:]  # the first line is probably cut
    return lines[-n:] if n > 0 else []


def tail_lines(path: Path | str, n: int = 50) -> list[str]:
    """The last n lines of a log (looking into the rotated copy when the file holds fewer).
    [] for a missing file."""
    path = Path(path)
    with _lock(path):
        lines = _last_lines(path, n)
        if len(lines) < n:
            lines = _last_lines(rotated_path(path), n - len(lines)) + lines
    return lines


def run_logs(directory: Path) -> list[Path]:
    """A replica's run logs, oldest first (by generation, then run)."""
    found = []
    for path in directory.glob("gen*-run*.log"):
        match = _RUN_LOG.match(path.name)
        if match:
            found.append((int(match[1]), int(match[2]), path))
    return [path for _gen, _run, path in sorted(found)]


def latest_log(directory: Path) -> Path | None:
    logs = run_logs(directory)
    return logs[-1] if logs else None


def next_run(directory: Path, generation: int) -> int:
    """The first run number of `generation` with no log file yet."""
    runs = [0]
    for path in run_logs(directory):
        match = _RUN_LOG.match(path.name)
        if match and int(match[1]) == generation:
            runs.append(int(match[2]))
    return max(runs) + 1


def prune(directory: Path, keep: int = LOG_KEEP) -> list[Path]:
    """Delete all but the newest `keep` run logs (with their rotated copy and offset file).
    Returns the deleted paths."""
    removed = []
    for path in run_logs(directory)[: -max(1, keep)]:
        for victim in (path, rotated_path(path), _base_path(path)):
            try:
                victim.unlink()
                removed.append(victim)
            except FileNotFoundError:
                pass
    return removed
