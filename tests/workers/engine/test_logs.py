"""Engine log files: offsets, copy-truncate rotation with an O_APPEND writer, tails, pruning."""

from __future__ import annotations

import os

from workers.engine.logs import (
    open_for_engine,
    prune,
    read_log,
    rotate_if_needed,
    rotated_path,
    run_log_path,
    run_logs,
    tail_lines,
)


def write(fd: int, first: int, count: int) -> None:
    os.write(fd, b"".join(b"line %04d\n" % i for i in range(first, first + count)))


def test_read_by_offset_returns_whole_lines_and_the_next_offset(tmp_path):
    path = run_log_path(tmp_path, 1, 1)
    fd = open_for_engine(path)
    write(fd, 0, 10)  # 10 bytes a line
    chunk = read_log(path, 0, 25)
    assert chunk == {"text": "line 0000\nline 0001\n", "next_offset": 20, "overflow": False}
    rest = read_log(path, chunk["next_offset"], 1000)
    assert rest["text"].startswith("line 0002") and rest["next_offset"] == 100
    assert read_log(path, 100)["text"] == ""
    assert read_log(path, -1, 20)["text"] == "line 0008\nline 0009\n"  # the last bytes
    os.close(fd)


def test_rotation_keeps_offsets_and_flags_lost_bytes(tmp_path):
    path = run_log_path(tmp_path, 1, 1)
    fd = open_for_engine(path)  # the engine's descriptor stays open across rotations
    write(fd, 0, 10)
    assert not rotate_if_needed(path, max_bytes=100)  # not over the limit yet
    write(fd, 10, 5)
    assert rotate_if_needed(path, max_bytes=100)
    assert path.stat().st_size == 0 and rotated_path(path).stat().st_size == 150
    write(fd, 15, 5)  # O_APPEND: lands at the start of the truncated file
    assert path.stat().st_size == 50
    old = read_log(path, 140, 1000)  # from the rotated copy, up to the cut
    assert old == {"text": "line 0014\n", "next_offset": 150, "overflow": False}
    assert read_log(path, 150, 1000)["text"].startswith("line 0015")
    write(fd, 20, 10)
    assert rotate_if_needed(path, max_bytes=100)  # the first copy is replaced: 0..150 lost
    lost = read_log(path, 20, 10)
    assert lost["overflow"] and lost["text"] == "line 0015\n" and lost["next_offset"] == 160
    assert read_log(path, 10_000)["overflow"]  # beyond the end (e.g. another run's offset)
    assert tail_lines(path, 3) == ["line 0027", "line 0028", "line 0029"]
    os.close(fd)


def test_tail_lines_reaches_into_the_rotated_copy(tmp_path):
    path = run_log_path(tmp_path, 1, 1)
    fd = open_for_engine(path)
    write(fd, 0, 20)
    rotate_if_needed(path, max_bytes=10)
    write(fd, 20, 2)
    assert tail_lines(path, 4) == ["line 0018", "line 0019", "line 0020", "line 0021"]
    assert tail_lines(tmp_path / "missing.log", 5) == []
    assert read_log(tmp_path / "missing.log", 0)["text"] == ""
    os.close(fd)


def test_prune_keeps_the_newest_run_logs(tmp_path):
    for generation, run in ((1, 1), (1, 2), (2, 1), (2, 10), (2, 2)):
        path = run_log_path(tmp_path, generation, run)
        path.write_text("x")
        rotated_path(path).write_text("y")
    removed = prune(tmp_path, keep=2)
    assert [p.name for p in run_logs(tmp_path)] == ["gen2-run2.log", "gen2-run10.log"]
    assert len(removed) == 6 and not rotated_path(run_log_path(tmp_path, 1, 1)).exists()
