"""`python -m workers` as a subprocess: parse-npu-smi JSON/table, exit 2, probe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_parse_json_shape_and_values(sample) -> None:
    text = sample("npu-smi-info-a3-v26.0rc2-proc-table-container-col-partial.txt")
    done = run("parse-npu-smi", "-", "--json", stdin=text)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "version": None,
        "npus": [
            {
                "npu_id": 7, "chip_id": 1, "name": "Ascend910", "health": "OK", "power_w": None,
                "temperature_c": 35.0, "aicore_percent": 0.0, "memory_used_mb": 0,
                "memory_total_mb": 0, "hbm_used_mb": 31877, "hbm_total_mb": 65536,
                "bus_id": "0000:83:00.0",
            }
        ],
        "processes": [
            {"npu_id": 0, "chip_id": 0, "pid": 632268, "name": "python3.1", "memory_mb": 197}
        ],
    }  # fmt: skip


def test_parse_file_argument_and_human_table(sample, tmp_path) -> None:
    path = tmp_path / "out.txt"
    path.write_text(sample("npu-smi-info-910-atlas800-9010-v24.1rc2-warning-procs.txt"))
    done = run("parse-npu-smi", str(path))
    assert done.returncode == 0
    assert "npu-smi version: 24.1.RC2" in done.stdout
    assert "Warning" in done.stdout and "processes: 32" in done.stdout
    data = json.loads(run("parse-npu-smi", str(path), "--json").stdout)
    assert [n["npu_id"] for n in data["npus"]] == list(range(8))


def test_missing_file_exits_2_with_one_line(tmp_path) -> None:
    done = run("parse-npu-smi", str(tmp_path / "absent.txt"), "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "absent.txt" in done.stderr


def test_garbled_input_exits_2_naming_the_line(sample) -> None:
    text = sample("npu-smi-info-910b1-v24.1rc3-partial.txt").replace(
        "| 94.6        49 ", "| 94.6        4x "
    )
    done = run("parse-npu-smi", "-", "--json", stdin=text)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "at line 9:" in done.stderr


def test_non_table_input_exits_2() -> None:
    done = run("parse-npu-smi", "-", stdin="npu-smi: command not found\n")
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "parse-npu-smi: cannot read -: no npu-smi table found",
    )


def test_probe_json_has_host_versions_and_providers() -> None:
    found = json.loads(run("probe", "--json").stdout)
    assert {"host", "versions", "ascend", "nvidia"} <= set(found) and "simulated" not in found
    assert isinstance(found["ascend"]["available"], bool)
    found = json.loads(run("probe", "--json", "--simulated").stdout)
    assert found["simulated"]["extra"]["simulated"] is True and found["simulated"]["chips"]


def test_build_parser_accepts_new_commands() -> None:
    from workers.__main__ import COMMANDS, build_parser, main

    calls = []
    commands = {
        **COMMANDS,
        "agent": ("run the agent", lambda p: None, lambda a: calls.append(a) or 0),
    }
    args = build_parser(commands).parse_args(["agent"])
    assert args.run(args) == 0 and calls
    assert main(["parse-npu-smi", "/nonexistent/file"]) == 2
