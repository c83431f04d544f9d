"""The quality figure: top-1 category accuracy over every real failure sample is >= 90%."""

from __future__ import annotations

from bench.diagnosis_accuracy import score
from tests.console.diagnosis.expected import EXPECTED
from tests.console.diagnosis.samples import ASCEND


def test_every_ascend_error_sample_has_an_expected_category():
    names = {p.name for p in ASCEND.glob("err-*")}
    assert names and names <= set(EXPECTED), names - set(EXPECTED)


def test_top1_category_accuracy_is_at_least_90_percent():
    result = score()
    assert result.scored >= len(list(ASCEND.glob("err-*")))
    assert result.ratio >= 0.9, f"{result.ratio:.1%}; misses: {result.misses}"
