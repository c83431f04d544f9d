"""The rule base: every rule file loads and validates; every rule matches its own real samples
(its category first where a sample is marked `top`) and none of its counter-samples."""

from __future__ import annotations

from collections import Counter

import pytest

from console.diagnosis.matcher import diagnose
from console.diagnosis.rulebook import CATEGORIES, load_rules, rulebook
from tests.console.diagnosis.samples import ENGINE, log_text, resolve

BOOK = load_rules()


def _cases(attr: str):
    for compiled in BOOK.rules:
        for n, sample in enumerate(getattr(compiled.rule, attr)):
            yield pytest.param(compiled.id, sample, id=f"{compiled.id}-{n}")


def _run(sample):
    text = ""
    if sample.file:
        path = resolve(sample.file)
        if path is None:
            if sample.file.endswith(".log"):
                pytest.skip(f"engine capture {sample.file} not present in {ENGINE}")
            pytest.fail(f"sample file {sample.file} is not in tests/fixtures")
        text = log_text(path)
    if sample.text:
        text = f"{text}\n{sample.text}" if text else sample.text
    return diagnose(
        text,
        exit_code=sample.exit_code,
        signal=sample.signal,
        health=sample.health,
        telemetry=sample.telemetry,
        book=BOOK,
    )


def test_rule_base_loads_with_at_least_30_rules_from_every_file():
    assert BOOK is not None and len(BOOK.rules) >= 30
    assert {c.file for c in BOOK.rules} >= {"memory.yaml", "device.yaml", "engine.yaml"}
    assert rulebook().rules  # the cached copy the app uses loads too


def test_every_fixed_category_is_known_and_extensions_give_a_reason():
    assert set(CATEGORIES) <= set(BOOK.categories)
    extensions = {k: v for k, v in BOOK.categories.items() if k not in CATEGORIES}
    assert extensions, "op-exception / graph-capture extend the vocabulary"
    assert all(len(reason) > 40 for reason in extensions.values())


def test_most_categories_have_a_rule():
    used = Counter(c.rule.category for c in BOOK.rules)
    assert set(CATEGORIES) <= set(used), set(CATEGORIES) - set(used)


@pytest.mark.parametrize(("rule_id", "sample"), list(_cases("samples")))
def test_rule_matches_its_sample(rule_id, sample):
    found = _run(sample)
    assert rule_id in [d.rule for d in found], f"{rule_id} did not match {sample}"
    if sample.top:  # first among what is known; a guess by wording (wording.py) may sit above
        # a symptom rule's own sample, which names no cause
        category = BOOK.by_id(rule_id).rule.category
        known = [d for d in found if not d.rule.startswith("wording:")]
        assert known[0].category == category, [(d.rule, d.category) for d in found]


@pytest.mark.parametrize(("rule_id", "sample"), list(_cases("counter_samples")))
def test_rule_does_not_match_its_counter_sample(rule_id, sample):
    assert rule_id not in [d.rule for d in _run(sample)]


def test_evidence_comes_from_the_log_with_line_numbers():
    path = resolve("err-oom-npu-out-of-memory-ray-deepseek-w8a8-hccl-warning.txt")
    text = log_text(path)
    top = diagnose(text)[0]
    assert top.rule == "npu-oom-torch-npu"
    lines = text.splitlines()
    for e in top.evidence:  # long lines are cut at 400 characters, marked with an ellipsis
        assert lines[e.line - 1].strip().startswith(e.text.removesuffix("…"))
        assert len(e.text) <= 400
