"""The guess by wording (console/diagnosis/wording.py): its model counts the development split
only, it answers only when nothing but symptoms was recognised, never on quiet lines, never with
a small lead, and in linear time."""

from __future__ import annotations

import json
import time

import pytest

from console.diagnosis import wording
from console.diagnosis.matcher import COLLECT_NEXT, diagnose
from tests.console.diagnosis.corpus import all_logs
from tests.console.diagnosis.wording_model import (
    build,
    development_logs,
    failure_lines,
    failure_words,
)


def test_the_shipped_model_is_counted_from_the_development_split_only():
    shipped = json.loads(wording.MODEL_FILE.read_text(encoding="utf-8"))
    assert shipped == build(), "rebuild: python -m tests.console.diagnosis.wording_model"
    assert sum(shipped["categories"].values()) == len(development_logs())
    assert {log.split for log in development_logs()} == {"dev"}
    assert any(log.split == "test" for log in all_logs())


@pytest.mark.parametrize(
    "name",
    [
        "vllm-ascend-5461-dsv32-two-node-socket-timeout.log",  # hccl-failure
        "vllm-29233-cpu-kvcache-space-default.log",  # kv-cache-insufficient
        "ascend-pytorch-67-setdevice-507033-el0003.log",  # npu-init-failure
    ],
)
def test_a_log_the_model_never_counted_is_read_by_its_wording(name):
    """Real development logs, each against a model counted without its thread."""
    logs = development_logs()
    (log,) = [x for x in logs if x.name == name]
    others = [x for x in logs if x.source != log.source]
    model = wording.Model.from_counts(
        wording.train((failure_words(x.text()), x.label) for x in others)
    )
    lines = failure_lines(log.text())
    guess = wording.closest(lines, symptom="engine-crash", using=model)
    assert guess is not None and guess.category == log.label, (guess, log.label)
    assert guess.evidence and all(dict(lines)[n] == t for n, t in guess.evidence)


@pytest.fixture
def toy_model(monkeypatch):
    """A model that knows two made-up failures (words no real rule uses)."""
    docs = [({"frobnicator", "wobbled"}, "npu-oom")] * 4 + [
        ({"gizmo", "zapped"}, "hccl-failure")
    ] * 4
    docs += [({"splat"}, "engine-crash")] * 4 + [
        ({"shared"}, "npu-oom"),
        ({"shared"}, "hccl-failure"),
    ]
    docs += [({"frobnicator", "wobbled", "splat", "gizmo", "zapped", "shared"}, "port-in-use")]
    model = wording.Model.from_counts(wording.train(docs))
    monkeypatch.setattr(wording, "model", lambda: model)
    return model


def test_the_guess_answers_when_nothing_else_is_recognised(toy_model):
    found = diagnose("started\nERROR the frobnicator wobbled again\nbye")
    assert [d.rule for d in found] == ["wording:npu-oom"]
    guess = found[0]
    assert guess.confidence == "low" and not guess.symptom
    assert [e.line for e in guess.evidence] == [2]
    assert "by the words of its failure lines" in guess.title and guess.remediation == (
        wording.remedy("npu-oom"),
    )


def test_the_guess_ranks_above_symptoms_which_keep_what_to_collect(toy_model):
    found = diagnose("Traceback (most recent call last):\nRuntimeError: the gizmo zapped")
    assert found[0].rule == "wording:hccl-failure"
    assert found[1].symptom and found[1].collect_next == COLLECT_NEXT


def test_no_guess_when_a_cause_is_recognised(toy_model):
    found = diagnose("ERROR the frobnicator wobbled\nOSError: [Errno 98] Address already in use")
    assert found[0].category == "port-in-use"
    assert not any(d.rule.startswith("wording:") for d in found)


@pytest.mark.parametrize(
    "text",
    [
        "[INFO] the frobnicator wobbled: timeout set by default",  # a quiet level
        "(Worker pid=1) INFO 10-28 21:14:48 the frobnicator failed over, all good",
        "WARNING the frobnicator wobbled",  # warnings alone
        "ERROR the shared thing failed",  # no lead: both categories use the word
        "ERROR the splat failed",  # the best is the symptom itself
        "ERROR something odd happened",  # no word the model knows
        "the frobnicator wobbled",  # no failure word
    ],
)
def test_no_guess(toy_model, text):
    assert not any(d.rule.startswith("wording:") for d in diagnose(text))


def test_the_guess_is_read_in_linear_time(toy_model):
    diagnose("warm up")
    line = "ERROR the frobnicator wobbled and failed "
    assert diagnose(line)[0].rule == "wording:npu-oom"

    def timed(n: int) -> float:
        text = "\n".join([line * 40] * n)  # failure lines of the model's own words
        start = time.perf_counter()
        diagnose(text)
        return time.perf_counter() - start

    small = min(timed(500) for _ in range(3))
    big = min(timed(2000) for _ in range(3))
    assert big < 6 * small + 0.05, (small, big)


def test_every_category_has_a_where_to_look_remedy():
    from console.diagnosis.codes import EXTRA_CATEGORIES
    from console.diagnosis.rulebook import rulebook

    categories = {*rulebook().categories, *EXTRA_CATEGORIES}
    assert categories <= set(wording.remedies()), categories - set(wording.remedies())
    assert set(json.loads(wording.MODEL_FILE.read_text())["categories"]) <= categories


def test_a_deadline_passed_during_the_pass_stops_before_the_guess(toy_model, monkeypatch):
    from console.diagnosis import matcher

    clock = iter([0.0, 10.0, 10.0])  # the pass looks once (line 1), the guess then
    monkeypatch.setattr(matcher.time, "monotonic", lambda: next(clock))
    with pytest.raises(matcher.DiagnosisTimeout):
        diagnose("ERROR the frobnicator wobbled again", deadline=5.0)
