"""The closest known failure by wording: the last resort when no rule, code or recogniser names
a cause.

Rules, codes and the vocabulary (matcher.py) know failures by the words someone wrote down for
them; a fresh log often says the same thing in other words. This model reads only the *failure
lines* of a log (a line with a failure word: error, failed, cannot, timeout, killed, …) as a bag
of words and asks which category's failure lines in the development split of the evaluation
corpus (tests/fixtures/corpus/) use those words most — a multinomial naive Bayes classifier,
counts in data/wording-model.json, built by `python -m tests.console.diagnosis.wording_model`
from development logs only (a test rebuilds it and compares).

It answers only when (1) nothing but symptoms or nothing at all was recognised, (2) the log has
failure lines, (3) the best category beats the runner-up by MARGIN (natural log of the
likelihood ratio) and (4) that category is not the symptom itself. Its answer has confidence
"low", says it is a guess by wording, and shows the failure lines whose words weigh most for it.
Measured on logs it never saw in docs/diagnosis.md ("Rounds 7-9").

Linear time: the failure-word test rides in the matcher's one RE2 pass; tokens are found by an
RE2 regex in lines already cut to MAX_LINE_CHARS; at most MAX_CHARS of failure lines are read.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from console.diagnosis.rulebook import compile_linear

MODEL_FILE = Path(__file__).resolve().parent / "data" / "wording-model.json"
MARGIN = 3.0  # log-likelihood lead over the runner-up needed to answer (e^3 ≈ 20 : 1)
ALPHA = 0.5  # additive smoothing of the word counts
MIN_LOGS = 2  # a word counts only if at least this many development logs use it
MAX_CHARS = 256 * 1024  # failure-line text read per log (the first: a log's cause comes early)
EVIDENCE_LINES = 3

# A failure line: one of these words anywhere in it (case-insensitive) and no INFO / DEBUG level
# on it (a plog's "[INFO] HCCL_CONNECT_TIMEOUT set by default" is not a failure). A warning
# counts as a failure line, but a log whose failure lines are all warnings (the word, or a
# warning's level) gets no guess.
_STRONG_WORDS = (
    r"error|exception|fail|traceback|cannot|can't|could not|couldn't|unable|not found|"
    r"no such|not support|unsupported|invalid|time ?out|timed out|killed|refused|denied|abort|"
    r"fatal|panic|hang|hung|stuck|exceed|insufficient|mismatch|undefined|missing|"
    r"too (?:large|small|old|new|many|long)|oom|out of memory|no module|not exist|"
    r"not available|not enough|incompatible|illegal|wrong|segmentation|core dumped|sigkill|"
    r"sigsegv|signal"
)
FAILURE_WORDS = rf"(?i:{_STRONG_WORDS}|warn)"
_QUIET_LEVEL = compile_linear(r"\[INFO\]|\bINFO\b|\[DEBUG\]|\bDEBUG\b")
_STRONG = compile_linear(rf"(?i:{_STRONG_WORDS})")
# a warning's level: Python's logging, glog's / c10's "W1202 18:50:44" and "[W1202 …", a
# Python warning category ("FutureWarning: …")
_WARNING_LEVEL = compile_linear(r"\bWARN(?:ING)?\b|^\[?W\d{4} |^\[W[\d ]|\w*Warning: ")
# A word: a name (letters, digits, underscores), a six-digit code (aclError / runtime / aclnn),
# a DCMI code (-8005). Six-digit codes also count by their first three digits (their class).
_FAILURE = compile_linear(FAILURE_WORDS)
_TOKEN = compile_linear(r"[A-Za-z][A-Za-z0-9_]{1,40}|\d{6}|-80\d\d")


def is_quiet(line: str) -> bool:
    """An INFO / DEBUG line: never a failure line, whatever its words."""
    return _QUIET_LEVEL.search(line) is not None


def is_failure_line(line: str) -> bool:
    """A line with a failure word and no INFO / DEBUG level (the matcher makes the same test
    in its one pass: its RE2 set holds FAILURE_WORDS, then it asks is_quiet)."""
    return _FAILURE.search(line) is not None and not is_quiet(line)


def has_error_line(lines: Iterable[tuple[int, str]]) -> bool:
    """Whether any of these failure lines has a failure word and no warning's level (an
    engine's start-up warns that a library "is not found", or that an entry point will be
    "unsupported" one day, and goes on)."""
    return bool(error_lines(lines, first_only=True))


def error_lines(
    lines: Iterable[tuple[int, str]], *, first_only: bool = False
) -> list[tuple[int, str]]:
    """The failure lines with a failure word and no warning's level, in order."""
    found = []
    for number, text in lines:
        if _STRONG.search(text) and not _WARNING_LEVEL.search(text):
            found.append((number, text))
            if first_only:
                break
    return found


def tokens(line: str) -> set[str]:
    """The words of one line as the model counts them."""
    out = set()
    for word in _TOKEN.findall(line):
        if word.isdigit():
            out.add(word)
            out.add("acl" + word[:3])
        else:
            out.add(word.lower())
    return out


def take(lines: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    """The failure lines the guess reads: the first ones, up to MAX_CHARS of text in all."""
    kept, size = [], 0
    for number, line in lines:
        if size >= MAX_CHARS:
            break
        kept.append((number, line))
        size += len(line)
    return kept


def log_tokens(lines: Iterable[str]) -> set[str]:
    """The words of a log's failure lines (`lines`: the failure lines already picked)."""
    words: set[str] = set()
    for line in lines:
        words |= tokens(line)
    return words


def train(documents: Iterable[tuple[set[str], str]]) -> dict:
    """The model's counts from (words of a log's failure lines, category) pairs."""
    logs_of: Counter = Counter()
    used_by: dict[str, Counter] = {}
    seen: Counter = Counter()
    for words, category in documents:
        logs_of[category] += 1
        for word in words:
            seen[word] += 1
            used_by.setdefault(word, Counter())[category] += 1
    vocabulary = sorted(w for w, n in seen.items() if n >= MIN_LOGS)
    return {
        "categories": dict(sorted(logs_of.items())),
        "words": {w: dict(sorted(used_by[w].items())) for w in vocabulary},
    }


@dataclass(frozen=True)
class Model:
    log_prior: dict[str, float]
    log_word: dict[str, dict[str, float]]  # word -> category -> log P(word | category)

    @classmethod
    def from_counts(cls, counts: dict) -> Model:
        categories = counts["categories"]
        words = counts["words"]
        total = {c: 0 for c in categories}
        for per in words.values():
            for c, n in per.items():
                total[c] += n
        size = len(words)
        norm = {c: math.log(total[c] + ALPHA * size) for c in categories}
        logs = sum(categories.values())
        return cls(
            log_prior={c: math.log(n / logs) for c, n in categories.items()},
            log_word={
                w: {c: math.log(per.get(c, 0) + ALPHA) - norm[c] for c in categories}
                for w, per in words.items()
            },
        )

    def scores(self, words: set[str]) -> list[tuple[str, float]]:
        """(category, log-likelihood) best first, over the words the model knows."""
        score = dict(self.log_prior)
        for word in words:
            per = self.log_word.get(word)
            if per is not None:
                for c in score:
                    score[c] += per[c]
        return sorted(score.items(), key=lambda kv: (-kv[1], kv[0]))

    def weight(self, word: str, best: str, runner_up: str) -> float:
        per = self.log_word.get(word)
        return per[best] - per[runner_up] if per else 0.0


@cache
def model() -> Model:
    return Model.from_counts(json.loads(MODEL_FILE.read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Closest:
    category: str
    lead: float  # log-likelihood over the runner-up
    runner_up: str
    evidence: tuple[tuple[int, str], ...]  # (line number, text), in log order


def closest(
    lines: list[tuple[int, str]], *, symptom: str, using: Model | None = None
) -> Closest | None:
    """The category whose development logs' failure lines read most like these, or None when
    the lead is under MARGIN, there are no failure lines, or the best is the symptom."""
    lines = take(lines)
    if not has_error_line(lines):
        return None  # no failure lines, or only warnings
    using = using or model()
    per_line = [(number, text, tokens(text)) for number, text in lines]
    ranked = using.scores(set().union(*(words for _, _, words in per_line)))
    (best, top), (runner_up, second) = ranked[0], ranked[1]
    if best == symptom or top - second < MARGIN:
        return None
    weighed = [
        (sum(using.weight(w, best, runner_up) for w in words), i)
        for i, (_, _, words) in enumerate(per_line)
    ]
    chosen = sorted(i for weight, i in sorted(weighed, reverse=True)[:EVIDENCE_LINES] if weight > 0)
    return Closest(
        category=best,
        lead=top - second,
        runner_up=runner_up,
        evidence=tuple((per_line[i][0], per_line[i][1]) for i in chosen),
    )


REMEDIES_FILE = Path(__file__).resolve().parent / "data" / "category-remedies.yaml"


@cache
def remedies() -> dict[str, str]:
    return yaml.safe_load(REMEDIES_FILE.read_text(encoding="utf-8"))


def remedy(category: str) -> str:
    """Where to look first for a failure of this category (our words)."""
    return remedies().get(category, "Read the lines shown for the cause.")
