"""Shared fixtures: where the real npu-smi captures are, and a reader for them."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Real captures, copied verbatim from ../shared/samples/ascend (each names its source);
# NPU_SAMPLES_DIR points the tests at another set of real captures.
SAMPLES_DIR = Path(os.environ.get("NPU_SAMPLES_DIR", REPO / "tests" / "fixtures" / "ascend"))
# `npu-smi info -m / -t / -l` captures are key/value or whitespace tables, not `|` tables.
_NOT_A_TABLE = re.compile(r"npu-smi-info-(m|t|l)-")


def table_samples() -> list[Path]:
    """Every `npu-smi info` table capture in SAMPLES_DIR ([] if the directory is absent)."""
    if not SAMPLES_DIR.is_dir():
        raise RuntimeError(f"npu-smi samples directory {SAMPLES_DIR} is absent")
    return sorted(
        path for path in SAMPLES_DIR.glob("npu-smi-info-*") if not _NOT_A_TABLE.match(path.name)
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "table_sample" in metafunc.fixturenames:
        samples = table_samples()
        metafunc.parametrize("table_sample", samples, ids=[p.name for p in samples])


@pytest.fixture
def sample() -> Callable[[str], str]:
    """read(name) -> text of a capture in SAMPLES_DIR (skips if the directory is absent)."""

    def read(name: str) -> str:
        return (SAMPLES_DIR / name).read_text(encoding="utf-8")

    return read


@pytest.fixture
def stand_in(tmp_path: Path) -> Callable[[str, str], Path]:
    """make(name, shell body) -> path of an executable stand-in for a vendor tool."""

    def make(name: str, body: str) -> Path:
        path = tmp_path / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
        return path

    return make
