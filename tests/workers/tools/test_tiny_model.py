"""`python -m workers.tools.tiny_model DIR` (`make tiny-model`): the one builder of the tiny model
that the engine tests serve and the README deploys. Needs `tokenizers` (a test dependency)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from workers.tools.tiny_model import FILES, build_tiny_model

REPO = Path(__file__).resolve().parents[3]


def tiny_model_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.tools.tiny_model", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_builds_the_model_and_prints_its_absolute_path(tmp_path):
    """From any directory, a relative DIR: the path printed is absolute."""
    out = subprocess.run(
        [sys.executable, "-m", "workers.tools.tiny_model", "models/tiny"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    dest = tmp_path / "models" / "tiny"
    assert out.stdout.strip() == str(dest)  # what a deployment's model path takes
    assert sorted(p.name for p in dest.iterdir()) == sorted(FILES)
    config = json.loads((dest / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_attention_heads"]) == (128, 4)
    assert config["max_position_embeddings"] == 512


def test_cli_and_library_write_the_same_bytes_and_a_rebuild_changes_nothing(tmp_path):
    """One builder: the CLI is the function the test fixture calls; building again is harmless."""
    assert tiny_model_cli(str(tmp_path / "cli"), "--dtype", "float32").returncode == 0
    build_tiny_model(tmp_path / "lib", dtype="float32")
    assert tiny_model_cli(str(tmp_path / "cli"), "--dtype", "float32").returncode == 0
    for name in FILES:
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "lib" / name).read_bytes()


def test_cli_refuses_a_directory_holding_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    out = tiny_model_cli(str(tmp_path))
    assert out.returncode == 2
    assert "holds other files (notes.txt)" in out.stderr
    assert not (tmp_path / "config.json").exists()
