"""The log shipper: reads what an engine (a separate process) writes, ships it in order,
resumes after a restart, survives truncation and rotation, and masks secrets."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workers.contracts import LOG_LINE_MAX_CHARS, LogBatch
from workers.engine import logs
from workers.engine.shipper import (
    BATCH_BYTES,
    BATCH_LINES,
    STATE_FILE,
    LogShipper,
    mask_secrets,
)

WRITER = textwrap.dedent(
    """
    import os, sys, time
    path, count = sys.argv[1], int(sys.argv[2])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    for i in range(1, count + 1):
        os.write(fd, f"INFO line {i}\\n".encode())
        if i % 500 == 0:
            time.sleep(0.01)
    os.close(fd)
    """
)


class Sink:
    def __init__(self) -> None:
        self.batches: list[LogBatch] = []

    def __call__(self, payload: dict) -> None:
        self.batches.append(LogBatch.model_validate(payload))

    @property
    def lines(self) -> list[str]:
        return [line for b in self.batches for line in b.lines]

    def numbered(self) -> list[tuple[int, str]]:
        return [(b.first_line_no + i, line) for b in self.batches for i, line in enumerate(b.lines)]


def run_log(tmp_path: Path, replica_id: int = 7, name: str = "gen1-run1.log") -> Path:
    directory = logs.replica_dir(tmp_path, replica_id)
    directory.mkdir(parents=True, exist_ok=True)
    return directory / name


def test_lines_written_by_another_process_arrive_in_order_without_loss(tmp_path):
    path = run_log(tmp_path)
    sink = Sink()
    shipper = LogShipper(tmp_path, "kp-01", sink)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "5000"])
    while writer.poll() is None:
        shipper.scan_once()
    shipper.scan_once()
    assert writer.returncode == 0
    assert sink.lines == [f"INFO line {i}" for i in range(1, 5001)]
    assert [n for n, _ in sink.numbered()] == list(range(1, 5001))
    assert all(len(b.lines) <= BATCH_LINES for b in sink.batches)
    first = sink.batches[0]
    assert (first.node, first.replica_id, first.generation, first.run) == ("kp-01", 7, 1, 1)
    assert first.file == "gen1-run1.log"


def test_a_partial_last_line_waits_for_its_newline(tmp_path):
    path = run_log(tmp_path)
    sink = Sink()
    shipper = LogShipper(tmp_path, "kp-01", sink)
    path.write_bytes(b"first\nsec")
    shipper.scan_once()
    assert sink.lines == ["first"]
    with open(path, "ab") as fh:
        fh.write("ond é\nthird\n".encode())
    shipper.scan_once()
    assert sink.numbered() == [(1, "first"), (2, "second é"), (3, "third")]


def test_restart_resumes_from_shipped_json_without_loss_or_duplicates(tmp_path):
    path = run_log(tmp_path)
    path.write_text("".join(f"line {i}\n" for i in range(1, 101)))
    first = Sink()
    LogShipper(tmp_path, "kp-01", first).scan_once()
    state = json.loads((path.parent / STATE_FILE).read_text())
    assert state["gen1-run1.log"] == {"offset": path.stat().st_size, "line_no": 100}
    with open(path, "a") as fh:
        fh.write("".join(f"line {i}\n" for i in range(101, 151)))
    second = Sink()  # a new agent process: only the shipped.json is shared
    LogShipper(tmp_path, "kp-01", second).scan_once()
    assert second.numbered() == [(i, f"line {i}") for i in range(101, 151)]


def test_a_failed_send_is_retried_next_scan(tmp_path):
    path = run_log(tmp_path)
    path.write_text("a\nb\n")
    calls = []

    def flaky(payload):
        calls.append(payload)
        if len(calls) == 1:
            raise ConnectionError("broker down")

    shipper = LogShipper(tmp_path, "kp-01", flaky)
    shipper.scan_once()
    shipper.scan_once()
    assert [c["lines"] for c in calls] == [["a", "b"], ["a", "b"]]
    assert calls[1]["first_line_no"] == 1


def test_truncation_below_the_offset_continues_from_zero_and_marks_a_gap(tmp_path):
    path = run_log(tmp_path)
    sink = Sink()
    shipper = LogShipper(tmp_path, "kp-01", sink)
    path.write_text("".join(f"old {i}\n" for i in range(1, 11)))
    shipper.scan_once()
    path.write_text("new 1\n")  # truncated by someone else, then written again
    shipper.scan_once()
    assert sink.lines[-1] == "new 1"
    assert sink.batches[-1].gap is True
    assert sink.batches[-1].first_line_no == 11  # numbering goes on: stored once, in order


def test_copy_truncate_rotation_loses_nothing(tmp_path):
    path = run_log(tmp_path)
    sink = Sink()
    shipper = LogShipper(tmp_path, "kp-01", sink)
    path.write_text("".join(f"a{i}\n" for i in range(50)))
    shipper.scan_once()
    with open(path, "a") as fh:
        fh.write("".join(f"b{i}\n" for i in range(50)))
    assert logs.rotate_if_needed(path, max_bytes=10)  # unshipped b* lines now live in .1
    with open(path, "a") as fh:
        fh.write("c0\n")
    shipper.scan_once()
    shipper.scan_once()
    expected = [f"a{i}" for i in range(50)] + [f"b{i}" for i in range(50)] + ["c0"]
    assert sink.lines == expected
    assert not any(b.gap for b in sink.batches)


def test_an_unreadable_file_is_reported_and_others_keep_shipping(tmp_path, caplog):
    bad = run_log(tmp_path, 1)
    bad.mkdir()  # a directory where a file should be: reading it fails
    good = run_log(tmp_path, 2)
    good.write_text("fine\n")
    sink = Sink()
    LogShipper(tmp_path, "kp-01", sink).scan_once()
    assert sink.lines == ["fine"]
    assert "cannot read" in caplog.text


def test_runs_are_shipped_oldest_first_and_an_old_runs_last_line_is_flushed(tmp_path):
    run_log(tmp_path, name="gen1-run1.log").write_text("crash: no newline")
    run_log(tmp_path, name="gen1-run2.log").write_text("started\n")
    sink = Sink()
    LogShipper(tmp_path, "kp-01", sink).scan_once()
    assert [(b.run, b.lines) for b in sink.batches] == [
        (1, ["crash: no newline"]),
        (2, ["started"]),
    ]


def test_secrets_are_masked_before_sending(tmp_path):
    path = run_log(tmp_path)
    path.write_text(
        "env HF_TOKEN=hf_abcdefghijklmnopqrstuv MY_SECRET=xyz DB_PASSWORD='p w'\n"
        "curl -H 'Authorization: Bearer eyJhbGciOi.abc-def' http://x\n"
        "vllm serve --api-key topsecret123 --port 8000\n"
        "key sk-proj-ABCDEFGHIJKLMNOP used\n"
    )
    sink = Sink()
    LogShipper(tmp_path, "kp-01", sink).scan_once()
    shipped = "\n".join(sink.lines)
    for secret in ("hf_abcdef", "xyz", "p w", "eyJhbGciOi", "topsecret123", "ABCDEFGHIJ"):
        assert secret not in shipped
    assert "HF_TOKEN=***" in shipped
    assert "Authorization: Bearer ***" in shipped
    assert "--api-key ***" in shipped
    assert "--port 8000" in shipped


def test_mask_leaves_ordinary_lines_alone():
    line = "INFO 12-02 10:00:00 [api_server.py:1] max_num_batched_tokens=8192 tokens=12"
    assert mask_secrets(line) == line
    assert "abc123" not in mask_secrets('{"api_key": "abc123"}')


def test_an_old_run_bigger_than_one_read_keeps_its_lines_whole(tmp_path):
    lines = [f"{i:06d} " + "x" * 90 for i in range(20_000)]  # ~2 MB: several reads
    run_log(tmp_path, name="gen1-run1.log").write_text("\n".join(lines))  # no final newline
    run_log(tmp_path, name="gen1-run2.log").write_text("")
    sink = Sink()
    LogShipper(tmp_path, "kp-01", sink).scan_once()
    assert sink.lines == lines


def test_a_line_cut_by_rotation_is_joined_across_the_rotated_copy(tmp_path):
    path = run_log(tmp_path)
    sink = Sink()
    shipper = LogShipper(tmp_path, "kp-01", sink)
    path.write_text("one\ntw")
    shipper.scan_once()
    assert logs.rotate_if_needed(path, max_bytes=1)
    with open(path, "a") as fh:
        fh.write("o\nthree\n")
    shipper.scan_once()
    assert sink.lines == ["one", "two", "three"]


def test_an_over_long_line_is_cut_with_a_visible_marker_and_the_next_lines_follow(tmp_path):
    path = run_log(tmp_path)
    long = "E" * (LOG_LINE_MAX_CHARS + 12_345)
    path.write_text(f"before\n{long}\nafter\n")
    sink = Sink()  # validates every batch as the console does: none is refused
    LogShipper(tmp_path, "kp-01", sink).scan_once()
    before, cut, after = sink.lines
    assert (before, after) == ("before", "after")
    assert len(cut) <= LOG_LINE_MAX_CHARS and cut.startswith("EEEE")
    kept = len(cut.split("…")[0])
    assert cut.endswith(f"… [cut {len(long) - kept} bytes]")
    assert [n for n, _ in sink.numbered()] == [1, 2, 3]  # line numbers as in the file


def test_batches_stay_under_the_consoles_size_cap(tmp_path):
    path = run_log(tmp_path)
    line = "é" * 8000  # 16,000 bytes of UTF-8 each
    path.write_text((line + "\n") * 200)
    sink = Sink()
    LogShipper(tmp_path, "kp-01", sink).scan_once()
    assert len(sink.lines) == 200 and len(sink.batches) > 1
    assert all(sum(len(x.encode()) + 1 for x in b.lines) <= BATCH_BYTES for b in sink.batches)


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("serve --api-key k1 k2 k3 --port 8000", "serve --api-key *** *** *** --port 8000"),
        ("--api_key=k1 --hf_token t", "--api_key=*** --hf_token ***"),
        ("non-default args: {'api_key': ['k1', 'k2'], 'port': 1}", "{'api_key': ***, 'port': 1}"),
        ("Namespace(api_key=['k1'], hf_token='t')", "Namespace(api_key=***, hf_token=***)"),
        ('{"api_key": "k1", "n": 1}', '{"api_key": ***, "n": 1}'),
        ("GET /x?token=k1", "GET /x?token=***"),
        ("Authorization: Basic dXNlcjpwdw==", "Authorization: Basic ***"),
        ("HF_TOKEN=k1 VLLM_API_KEY=k2", "HF_TOKEN=*** VLLM_API_KEY=***"),
        ("broker redis://u:k1@h:6379/0", "broker redis://u:***@h:6379/0"),
        (
            "max_tokens=128, 12.5 tokens/s, basic attention",
            "max_tokens=128, 12.5 tokens/s, basic attention",
        ),
    ],
)
def test_mask_handles_list_and_multi_value_forms(line, shown):
    assert shown in mask_secrets(line) and "k1" not in mask_secrets(line)
