"""The committed npu-smi captures are verbatim copies of the shared real samples."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1].parent
FIXTURES = REPO / "tests" / "fixtures" / "ascend"
SHARED = REPO.parent / "shared" / "samples" / "ascend"


def test_every_fixture_is_a_real_capture_with_its_source():
    files = sorted(FIXTURES.glob("npu-smi-*"))
    assert len(files) >= 30
    for path in files:
        assert path.read_text(encoding="utf-8").startswith("# source:"), path.name


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not next to this checkout")
def test_fixtures_equal_the_shared_samples():
    for path in sorted(SHARED.iterdir()):
        copy = FIXTURES / path.name
        assert copy.exists(), f"{path.name} is not copied into tests/fixtures/ascend"
        assert copy.read_bytes() == path.read_bytes(), path.name
