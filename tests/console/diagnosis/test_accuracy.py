"""The quality figures: top-1 category accuracy on the rule samples and on the evaluation corpus
(real logs from public issue threads, split by thread into development and test sets), and never
an empty answer for a log that holds an Ascend error code."""

from __future__ import annotations

from bench.diagnosis_accuracy import score
from tests.console.diagnosis.corpus import (
    all_logs,
    corpus_logs,
    cpu_logs,
    fixture_logs,
    split_of,
)
from tests.console.diagnosis.expected import EXPECTED
from tests.console.diagnosis.samples import ASCEND

# Floors pinned at what the rules reach (docs/diagnosis.md has the figures); the goal is 90 %.
# Round 6 (50 harder logs) lowered both ratios; on the 362 logs before it the rules went from
# dev 253/267, test 99/131 to dev 253/267, test 101/131: no regression behind the lower floors.
# Rounds 7-8 (72 logs) did the same to the development ratio: the 293 logs before them went
# from 273 to 280 (the guess by wording, which counted them).
FIXTURES_FLOOR = 0.9
DEV_FLOOR = 0.95  # 373/391 (the wording model counted these logs: see docs)
TEST_FLOOR = 0.77  # 164/211 (round 12 added 13 test logs, 8 right; see docs)
# The fifth set made on this CPU (10, fresh 8/10) lowered the CPU ratio; the 43 before it stay
# 41/43. Its development miss is a label whose premise failed (docs/diagnosis.md).
CPU_FLOOR = 0.92  # 49/53 (fresh, before any change they drove: 16/19, 11/11, 3/3, 8/10, 8/10)


def test_every_ascend_error_sample_has_an_expected_category():
    names = {p.name for p in ASCEND.glob("err-*")}
    assert names and names <= set(EXPECTED), names - set(EXPECTED)


def test_the_corpus_holds_150_real_logs_each_with_its_source_and_a_known_label():
    from console.diagnosis.rulebook import rulebook

    logs = corpus_logs()
    assert len(logs) >= 150
    categories = set(rulebook().categories)
    for log in logs:
        assert log.source.startswith("https://"), log.name
        assert log.label in categories, (log.name, log.label)
        first = log.path.read_text(encoding="utf-8").splitlines()[0]
        assert first == f"# source: {log.source}", log.name
    assert len({log.source for log in logs}) == len(logs)  # one log per thread


def test_the_split_is_by_thread_and_both_sides_are_large():
    logs = corpus_logs()
    test = [log for log in logs if log.split == "test"]
    assert 0.25 * len(logs) <= len(test) <= 0.5 * len(logs)
    assert all(split_of(log.source) == log.split for log in logs)


def test_no_rule_sample_is_a_test_log():
    from console.diagnosis.recognisers import vocabulary
    from console.diagnosis.rulebook import rulebook

    test_names = {log.name for log in corpus_logs() + cpu_logs() if log.split == "test"}

    def cites_a_test_log(source: str | None) -> bool:
        return any(name in (source or "") for name in test_names)

    for rule in rulebook().rules:
        for sample in (*rule.rule.samples, *rule.rule.counter_samples):
            assert sample.file not in test_names, (rule.id, sample.file)
            assert not cites_a_test_log(sample.source), (rule.id, sample.source)
    for word in vocabulary():  # the vocabulary's examples are tuned on development logs too
        for example in (*word.entry.examples, *word.entry.counter):
            assert not cites_a_test_log(example.source), (word.entry.id, example.source)


def test_top1_on_the_rule_samples_is_at_least_90_percent():
    result = score(fixture_logs())
    assert result.scored >= len(list(ASCEND.glob("err-*")))
    assert result.ratio >= FIXTURES_FLOOR, f"{result.ratio:.1%}; misses: {result.misses}"


def test_top1_on_the_development_set_holds_its_floor():
    result = score([log for log in all_logs() if log.split == "dev"])
    assert result.ratio >= DEV_FLOOR, f"{result.ratio:.1%}; misses: {result.misses}"


def test_top1_on_the_test_set_holds_its_floor():
    result = score([log for log in corpus_logs() if log.split == "test"])
    # a plain number: pytest's report of `result.ratio` would print the Score, test misses and all
    ratio = result.ratio
    assert ratio >= TEST_FLOOR, f"{ratio:.1%}"  # misses are not printed


def test_a_log_with_an_ascend_code_never_gets_an_empty_answer():
    result = score(all_logs())
    assert result.coded_but_empty == []


def test_the_logs_made_on_this_cpu_are_the_cases_that_made_them():
    from console.diagnosis.rulebook import rulebook
    from tests.console.diagnosis.cpu_logs import CASES

    logs = {log.name: log for log in cpu_logs()}
    assert sorted(logs) == sorted(f"{case.name}.log" for case in CASES)
    categories = set(rulebook().categories)
    for case in CASES:
        log = logs[f"{case.name}.log"]
        assert (log.source, log.label) == (case.source, case.label)
        assert log.label in categories
        first = log.path.read_text(encoding="utf-8").splitlines()[0]
        assert first == f"# source: {case.source}", log.name
    assert {log.split for log in logs.values()} == {"dev", "test"}


def test_top1_on_the_logs_made_on_this_cpu_holds_its_floor():
    result = score(cpu_logs())
    assert result.ratio >= CPU_FLOOR, f"{result.ratio:.1%}"  # misses are not printed
