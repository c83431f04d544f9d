"""Match a log (plus exit code, signal, npu-smi health, telemetry) against what the console knows.

`diagnose()` is pure Python — no database, no Django — and makes one pass over the lines. Three
kinds of knowledge answer, best first:

1. rules (rules/*.yaml): one failure each, with its evidence and remedy — confidence "high";
2. the published Ascend codes (codes.py: aclError, CANN error-message codes, DCMI) — "medium"
   for a code in the tables, "low" for one known only by its class or module;
3. the vocabulary of failures (recognisers.py): the exception a traceback ends with, the words
   of an ERROR line — "medium" for an exception, "low" for an error line;
4. only when 1-3 found nothing but symptoms: the closest known failure by the words of the
   log's failure lines (wording.py, a model counted from the corpus's development logs) — "low";
5. only when nothing at all was found, the log has no error line (nothing but progress,
   INFO/DEBUG lines and warnings, whatever their words), is an engine's log or says it hangs
   (ENGINE_LOG), does not end at "Application startup complete." and came without an exit
   code or signal: the log of an engine that stopped making progress — a hang, "low", its
   last lines as evidence.

Ranking puts the root cause first: a symptom (a rule whose `consequence_of` names another
category that fired, the engine-crash category, a generic exception) never outranks a cause
found in the same log; then higher confidence, then `priority`, then the earlier line. When
only symptoms are found, the top answer says so and what to collect next.

Linear time, whatever the input: every regex runs in RE2 (no backtracking), all of a rule
book's regexes in one automaton per line (rulebook.LineIndex), and a line longer than
MAX_LINE_CHARS is read in overlapping pieces of that size. `deadline` (time.monotonic())
bounds the whole pass: DiagnosisTimeout when it is passed.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from console.diagnosis import codes as codebook_mod
from console.diagnosis import recognisers, wording
from console.diagnosis.rulebook import (
    ANY_OTHER,
    HEALTH_VALUES,
    CompiledRule,
    LineIndex,
    RuleBook,
    Target,
    compile_linear,
    rulebook,
)

MAX_EVIDENCE = 5  # lines kept per diagnosis, after de-duplication
MAX_EVIDENCE_CHARS = 400  # a line longer than this is cut (with an ellipsis)
MAX_LINE_CHARS = 4096  # a longer line is read in pieces of this size …
LINE_OVERLAP = 256  # … overlapping by this much, so a phrase across a cut is still seen
MAX_CODES = 5  # distinct codes answered from the tables per log
QUIET_EVIDENCE = 3  # last lines shown for a log without an error line
# someone saying it hangs: a statement of the symptom, not an error line
HANG_WORDS = (
    r"(?i:\b(?:hangs?|hung|hanging|stuck|freez(?:e|es|ing)|frozen|no response)\b)|卡住|卡死"
)
# A line only an inference engine's process writes — vLLM's logger ("INFO 05-20 05:40:24
# [file.py:206]"), its process prefixes ("(EngineCore pid=115)"), SGLang's ("[2025-01-02
# 10:11:12 TP0]"), c10's warnings ("[W compiler_depend.ts:615]"), a py-spy dump ("Thread 7
# (idle): ") — or someone saying it hangs. npu-smi tables, install logs and plog INFO lines
# without an error are not a stalled engine.
ENGINE_LOG = (
    r"\b(?:INFO|DEBUG|WARNING|WARN)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[\w./-]+:\d+\]|"
    r"^\s*\((?:EngineCore|APIServer|VllmWorker|RayWorkerWrapper|Worker|EngineCore_DP\d+)\b[^)]*\)|"
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [TDP]P\d+)*\] |"
    r"^\[W(?:\d{3,4} [\d:.]+)? [\w./-]+:\d+\]|"
    r"^Thread \d+ \((?:idle|active)\): |" + HANG_WORDS
)
STARTED = "Application startup complete."
UNREAD_EVIDENCE = 3  # error lines shown when nothing reads them
# a line a program logged at an error level (not prose that mentions an error)
_ERROR_LEVEL = compile_linear(r"\b(?:ERROR|FATAL|CRITICAL)\b|\[E\]|^E\d{4} ")
_HANG_WORDS = compile_linear(HANG_WORDS)
DEADLINE_EVERY = 256  # pieces between two looks at the clock
_HEALTH = {v.lower(): v for v in HEALTH_VALUES}
CONFIDENCE = {"high": 0, "medium": 1, "low": 2}
SYMPTOM_CATEGORY = "engine-crash"
COLLECT_NEXT = (
    "Only symptoms were recognised (the engine died); the cause is usually earlier or in the "
    "device logs. Collect next:",
    "the engine log from its first line (the console keeps it: the replica's log page);",
    "the newest CANN plog of the engine's process: `ls -t ~/ascend/log/debug/plog/ | head` "
    "(or under $ASCEND_PROCESS_LOG_PATH), and the device logs: `msnpureport -f` / "
    "/var/log/npu/slog/;",
    "the NPU's state: `npu-smi info`, `npu-smi info -t health -i N`, and `dmesg -T | grep -i "
    "-e davinci -e ascend`;",
    "run again with `ASCEND_GLOBAL_LOG_LEVEL=1 ASCEND_LAUNCH_BLOCKING=1` to name the failing "
    "operator.",
)
QUIET_COLLECT_NEXT = (
    "The log has no error line: the process was still running, or stopped without saying why. "
    "Collect next:",
    "whether the engine is still alive and busy: `ps -ef | grep -i vllm`, `npu-smi info` "
    "(AICore use of its NPUs);",
    "where it waits, while it hangs: `py-spy dump --pid <pid>` of the API server, the engine "
    "core and every worker;",
    "the log after it, with `VLLM_LOGGING_LEVEL=DEBUG`, and every rank's newest CANN plog "
    "(`ls -t ~/ascend/log/debug/plog/ | head`) for an HCCL wait;",
    "if it exited: its exit code and `dmesg -T | grep -i -e oom -e killed` (a kill leaves no line "
    "in the log).",
)


class DiagnosisTimeout(Exception):
    """The pass did not finish before its deadline (a pasted log too big for the limit)."""


@dataclass(frozen=True)
class Evidence:
    line: int | None  # 1-based line number in the text; None for exit code, signal, health…
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "text": self.text}


@dataclass(frozen=True)
class Diagnosis:
    rule: str
    category: str
    severity: str
    title: str
    evidence: tuple[Evidence, ...]
    remediation: tuple[str, ...]
    explanation: str
    links: tuple[dict[str, str], ...]
    priority: int
    confidence: str = "high"  # high (a rule), medium, low: see the module's docstring
    symptom: bool = False
    collect_next: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """The JSON shape shared by the API, the `diagnose` command and the page."""
        return {
            "rule": self.rule,
            "category": self.category,
            "severity": self.severity,
            "title": self.title,
            "evidence": [e.as_dict() for e in self.evidence],
            "remediation": list(self.remediation),
            "explanation": self.explanation,
            "links": [dict(link) for link in self.links],
            "confidence": self.confidence,
            "symptom": self.symptom,
            "collect_next": list(self.collect_next),
        }


class _Hits:
    """Evidence gathered for one rule (or one code, one recognised exception) in the pass."""

    __slots__ = ("evidence", "seen", "first", "required", "full", "matched")

    def __init__(self, n_requires: int) -> None:
        self.matched = False  # a `patterns`/`codes` line was seen (requires alone do not fire)
        self.evidence: list[Evidence] = []
        self.seen: set[str] = set()
        self.first: int | None = None
        self.required = [False] * n_requires
        self.full = False

    def add(self, number: int | None, text: str) -> None:
        text = text.strip()
        if number is not None and self.first is None:
            self.first = number
        if text in self.seen or len(self.evidence) >= MAX_EVIDENCE:
            return
        self.seen.add(text)
        if len(text) > MAX_EVIDENCE_CHARS:
            text = text[: MAX_EVIDENCE_CHARS - 1] + "…"
        self.evidence.append(Evidence(number, text))


# What a log collector or a terminal adds to each line, read past so rules see the engine's own
# line: colour codes (ESC[..m, or as pastes keep them: ^[[..m, #033[..m, a bare [1;36m), and a
# line prefix — docker compose's `service-1  | `, the container runtime's (CRI) `2025-06-01T10:
# 00:00.123Z stderr F `, an ISO timestamp `kubectl logs --timestamps` puts first, journald's
# `Jun 01 10:00:00 host python3[1234]: `.
_COLOUR = compile_linear(r"(?:\x1b|\^\[|#033)\[[0-9;]{0,16}m|\[(?:[0-9]{1,2};)*[0-9]{1,2}m")
_COLLECTOR_PREFIX = compile_linear(
    r"^(?:[\w.-]{1,64} {1,40}\| |"
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)? "
    r"(?:(?:stdout|stderr) [FP] )?|"
    r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]{1,64} [\w./@-]{1,64}(?:\[\d{1,10}\])?: )"
)


def clean(line: str) -> str:
    """The line as the engine wrote it: colour codes and a log collector's prefix removed.
    (Cheap looks first: most lines have neither, and this runs on every line.)"""
    if "[" in line and (
        "\x1b" in line or "^[[" in line or "033[" in line or "[0m" in line or "[0;0m" in line
    ):
        line = _COLOUR.sub("", line)
    if (
        line.find("| ", 0, 110) >= 0
        or (line[4:5] == "-" and line[10:11] == "T")
        or (line[3:4] == " " and line[9:10] == ":")
    ):
        line = _COLLECTOR_PREFIX.sub("", line, count=1)
    return line


def pieces(text: str):
    """(line number, text) of every line, cleaned (clean()), a long line as overlapping
    MAX_LINE_CHARS pieces."""
    step = MAX_LINE_CHARS - LINE_OVERLAP
    for number, raw in enumerate(text.splitlines(), start=1):
        line = clean(raw)
        if len(line) <= MAX_LINE_CHARS:
            yield number, line
            continue
        for start in range(0, len(line) - LINE_OVERLAP, step):
            yield number, line[start : start + MAX_LINE_CHARS]


@dataclass
class _Found:
    rules: dict[int, _Hits] = field(default_factory=dict)
    codes: dict[str, tuple[codebook_mod.CodeEntry, _Hits]] = field(default_factory=dict)
    words: dict[str, tuple[recognisers.Recognised, _Hits, str]] = field(default_factory=dict)
    failure_lines: list[tuple[int, str]] = field(default_factory=list)  # for wording.closest
    failure_chars: int = 0
    engine_log: bool = False  # a line matched ENGINE_LOG


_RECOGNISERS = {
    "message-code": codebook_mod.MESSAGE_CODE.pattern,
    "acl-code": codebook_mod.ACL_CODE.pattern,
    "dcmi-code": codebook_mod.DCMI_CODE.pattern,
    "driver-code": codebook_mod.DRIVER_CODE.pattern,
    "exception": recognisers.EXCEPTION,
    "error-line": recognisers.ERROR_LINE,
    "failure-words": wording.FAILURE_WORDS,
    "engine-log": ENGINE_LOG,
}


_CODE_KINDS = frozenset({"message-code", "acl-code", "dcmi-code", "driver-code"})


def _recogniser_index() -> LineIndex:
    global _recognisers
    if _recognisers is None:
        _recognisers = LineIndex([(pattern, name) for name, pattern in _RECOGNISERS.items()])
    return _recognisers


_recognisers: LineIndex | None = None


def _scan(text: str, book: RuleBook, deadline: float | None) -> _Found:
    """One pass over the lines: rule hits, codes, and the vocabulary readings."""
    found = _Found()
    hits = {i: _Hits(len(r.requires)) for i, r in enumerate(book.rules) if r.line_regexes}
    others = _recogniser_index()
    codes = codebook_mod.codebook()
    for count, (number, line) in enumerate(pieces(text)):
        if deadline is not None and count % DEADLINE_EVERY == 0 and time.monotonic() > deadline:
            raise DiagnosisTimeout(f"stopped at line {number}")
        for target in book.index.match(line):
            _hit(hits.get(target.rule), target, number, line)
        kinds = others.match(line)
        if not kinds:
            continue
        if "engine-log" in kinds:
            found.engine_log = True
        if (
            "failure-words" in kinds
            and found.failure_chars < wording.MAX_CHARS
            and not wording.is_quiet(line)
        ):
            found.failure_lines.append((number, line))
            found.failure_chars += len(line)
        if not _CODE_KINDS.isdisjoint(kinds):
            for entry in codebook_mod.find_codes(line, codes):
                _add_code(found, entry, number, line)
        if "exception" in kinds or "error-line" in kinds:
            reading = recognisers.read_line(line, error_line="error-line" in kinds)
            if reading is not None:
                _add_reading(found, reading, number, line)
    found.rules = {i: h for i, h in hits.items() if h.matched and all(h.required)}
    return found


def _hit(hit: _Hits | None, target: Target, number: int, line: str) -> None:
    if hit is None or hit.full:
        return
    if target.require is None:
        hit.matched = True
        hit.add(number, line)
    elif not hit.required[target.require]:
        hit.required[target.require] = True
        hit.add(number, line)
    if hit.matched and len(hit.evidence) >= MAX_EVIDENCE and all(hit.required):
        hit.full = True  # nothing more to learn about this rule


def _add_code(found: _Found, entry, number: int, line: str) -> None:
    if entry.code not in found.codes:
        if len(found.codes) >= MAX_CODES:
            return
        found.codes[entry.code] = (entry, _Hits(0))
    found.codes[entry.code][1].add(number, line)


def _add_reading(found: _Found, reading: recognisers.Recognised, number: int, line: str) -> None:
    key = (reading.entry.id if reading.entry else "exception") + (
        ":exception" if reading.exception else ":line"
    )
    if key not in found.words:
        found.words[key] = (reading, _Hits(0), key)
    found.words[key][1].add(number, line)


def _other_triggers(rule: CompiledRule, exit_code, signal, health, telemetry) -> list[str]:
    match = rule.rule.match
    found = []
    if exit_code is not None and exit_code in match.exit_codes:
        found.append(f"exit code {exit_code}")
    if signal is not None and signal in match.signals:
        found.append(f"killed by signal {signal}")
    if health is not None and health in match.health:
        found.append(f"npu-smi health: {health}")
    if telemetry:
        found.extend(rule.telemetry_hits(telemetry))
    return found


def _normalise(exit_code, signal, health):
    # Popen reports death by signal N as returncode -N.
    if exit_code is not None and exit_code < 0 and signal is None:
        signal, exit_code = -exit_code, None
    if health is not None:
        health = _HEALTH.get(str(health).strip().lower(), str(health).strip())
    return exit_code, signal, health


def diagnose(
    text: str,
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    health: str | None = None,
    telemetry: dict[str, float] | None = None,
    book: RuleBook | None = None,
    deadline: float | None = None,
) -> list[Diagnosis]:
    """What this evidence shows, root cause first; [] only when nothing is recognised.

    Pure and deterministic: the same input gives the same list. `telemetry` maps names such
    as `temperature_c` to numbers; `health` is an npu-smi value (OK, Warning, Alarm, Critical,
    UNKNOWN, any case). `deadline`: a time.monotonic() value; DiagnosisTimeout once passed."""
    book = book or rulebook()
    exit_code, signal, health = _normalise(exit_code, signal, health)
    scanned = _scan(text, book, deadline)
    candidates: list[tuple[tuple, Diagnosis]] = []
    categories = set()
    fired: list[tuple[CompiledRule, _Hits]] = []
    for i, rule in enumerate(book.rules):
        hit = scanned.rules.get(i)
        extra = _other_triggers(rule, exit_code, signal, health, telemetry)
        if hit is None and not extra:
            continue
        hit = hit or _Hits(0)
        for line in extra:
            hit.add(None, line)
        fired.append((rule, hit))
        categories.add(rule.rule.category)
    # a rule written for this code, or matching the very lines it is on, says it better — unless
    # that rule only names a symptom (an ERR00100 trailer, a traceback): a code on its line is
    # still the more specific reading (a JSON error body puts the whole error on one line)
    causes = [(rule, hit) for rule, hit in fired if rule.rule.category != SYMPTOM_CATEGORY]
    ruled_codes = {code for rule, _ in causes for code in rule.rule.match.codes}
    ruled_lines = {e.line for _, hit in causes for e in hit.evidence if e.line is not None}
    others: list[tuple[Diagnosis, _Hits]] = [
        (_from_code(entry, hit), hit)
        for entry, hit in scanned.codes.values()
        if entry.code not in ruled_codes and not {e.line for e in hit.evidence} <= ruled_lines
    ]
    others += [(_from_reading(r, hit, key), hit) for r, hit, key in scanned.words.values()]
    # a code that says only that a task ran past its limit (…_TIMEOUT) names no first cause: an
    # HCCL wait rule is not the consequence of the FFTS+ timeout its own stuck collective makes
    waited = {f"code:{entry.code}" for entry, _ in scanned.codes.values() if entry.timeout}
    categories |= {d.category for d, _ in others if not d.symptom and d.rule not in waited}
    for rule, hit in fired:
        diagnosis = _from_rule(rule, hit, _demoted(rule, categories))
        candidates.append((_key(diagnosis, hit), diagnosis))
    candidates += [(_key(d, hit), d) for d, hit in others]
    ranked = _dedupe([d for _, d in sorted(candidates, key=lambda c: c[0])])
    if ranked and all(d.symptom for d in ranked):
        top = ranked[0]
        ranked[0] = Diagnosis(**{**top.__dict__, "collect_next": COLLECT_NEXT})
    if all(d.symptom for d in ranked) and scanned.failure_lines:
        if deadline is not None and time.monotonic() > deadline:
            raise DiagnosisTimeout("stopped before the guess by wording")
        guess = wording.closest(scanned.failure_lines, symptom=SYMPTOM_CATEGORY)
        if guess is not None:
            ranked.insert(0, _from_wording(guess))
    if not ranked and exit_code is None and signal is None and _stalled(scanned):
        last = _last_lines(text)
        if last and STARTED not in last[-1][1]:
            ranked.append(_quiet_log(last))
    if not ranked:
        said = [x for x in wording.error_lines(scanned.failure_lines) if _ERROR_LEVEL.search(x[1])]
        said = said[:UNREAD_EVIDENCE]
        if said:
            ranked.append(_unread_error(said))
    return ranked


def _stalled(scanned: _Found) -> bool:
    """An engine's log without an error line (a line saying it hangs is none)."""
    said = [(n, line) for n, line in scanned.failure_lines if not _HANG_WORDS.search(line)]
    return scanned.engine_log and not wording.has_error_line(said)


def _last_lines(text: str) -> list[tuple[int, str]]:
    """The last QUIET_EVIDENCE non-blank lines, numbered as the pass numbers them (read only
    for the rare log that may show a stall, not on every line of every pass)."""
    lines = text.splitlines()
    last: list[tuple[int, str]] = []
    for number in range(len(lines), 0, -1):
        if lines[number - 1].strip():
            last.insert(0, (number, lines[number - 1]))
            if len(last) == QUIET_EVIDENCE:
                break
    return last


def _demoted(rule: CompiledRule, categories: set[str]) -> bool:
    others = categories - {rule.rule.category}
    causes = set(rule.rule.consequence_of)
    return bool(others & causes) or (ANY_OTHER in causes and bool(others))


def _key(d: Diagnosis, hit: _Hits) -> tuple:
    first = hit.first if hit.first is not None else float("inf")
    return (d.symptom, CONFIDENCE[d.confidence], -d.priority, first, d.rule)


def _dedupe(ranked: list[Diagnosis]) -> list[Diagnosis]:
    """A code or a reading that only repeats a category a rule above it already gave adds
    nothing but noise: kept only when it says something new."""
    out: list[Diagnosis] = []
    rule_categories: set[str] = set()
    for d in ranked:
        if (
            d.confidence != "high"
            and d.category in rule_categories
            and not d.rule.startswith("code:")
        ):
            continue
        if d.confidence == "high":
            rule_categories.add(d.category)
        out.append(d)
    return out


def _from_rule(compiled: CompiledRule, hit: _Hits, demoted: bool) -> Diagnosis:
    rule = compiled.rule
    return Diagnosis(
        rule=rule.id,
        category=rule.category,
        severity=rule.severity,
        title=rule.title,
        evidence=tuple(hit.evidence),
        remediation=tuple(rule.remediation),
        explanation=rule.explanation.strip(),
        links=tuple({"title": link.title, "url": link.url} for link in rule.links),
        priority=rule.priority,
        confidence="high",
        symptom=demoted or rule.category == SYMPTOM_CATEGORY,
    )


def _answer(
    hit: _Hits, *, remedy: str, links: tuple = (), severity: str = "critical", **fields
) -> Diagnosis:
    """A diagnosis that is not a rule's (tables, vocabulary, the matcher's own answers): one
    remedy, critical unless said."""
    return Diagnosis(
        severity=severity,
        evidence=tuple(hit.evidence),
        remediation=(remedy,),
        links=links,
        **fields,
    )


def _article(noun: str) -> str:
    return "an" if noun[:1].lower() in "aeiou" else "a"


def _from_code(entry, hit: _Hits) -> Diagnosis:
    kind = codebook_mod.KIND_TITLES[entry.kind]
    name = f" ({entry.name})" if entry.name else ""
    known = "" if entry.exact else " — this exact code is not in the table; its class says:"
    return _answer(
        hit,
        rule=f"code:{entry.code}",
        category=entry.category,
        title=f"{kind} {entry.code}{name}{known or ':'} {entry.meaning}",
        remedy=entry.remedy,
        explanation=(
            f"{entry.code} is {_article(kind)} {kind}{name}. {entry.meaning} Read from the published "
            f"table: {entry.source_title}."
        ),
        links=({"title": entry.source_title, "url": entry.source_url},),
        priority=(20 if entry.inner else 50) if entry.exact else 30,
        confidence="medium" if entry.exact and not entry.inner else "low",
        symptom=entry.category == SYMPTOM_CATEGORY,
    )


def _from_reading(reading: recognisers.Recognised, hit: _Hits, key: str) -> Diagnosis:
    entry = reading.entry
    said = f"{reading.exception}: {reading.message}" if reading.exception else reading.message
    said = said if len(said) <= 160 else said[:159] + "…"
    if entry is None:  # an exception with no known words: what the engine died of, a symptom
        return _answer(
            hit,
            rule="exception",
            category=SYMPTOM_CATEGORY,
            title=f"The engine stopped on {said}",
            remedy="Read the lines above the exception for its cause.",
            explanation=(
                "The log ends a Python traceback with this exception; no rule and no known "
                "wording says what caused it."
            ),
            priority=20,
            confidence="low",
            symptom=True,
        )
    where = "the exception a traceback ends with" if reading.exception else "an error line"
    return _answer(
        hit,
        rule=f"words:{key}",
        category=entry.category,
        title=f"{entry.title}: {said}",
        remedy=entry.remedy,
        explanation=(
            f"Recognised by its wording ({where}), not by a rule written for this failure: "
            f"{entry.title.lower()}."
        ),
        # below a code's table meaning (specific), above a code known only by its class
        priority=45 if reading.exception else 25,
        confidence="medium" if reading.exception else "low",
        symptom=entry.category == SYMPTOM_CATEGORY,
    )


def _from_wording(guess: wording.Closest) -> Diagnosis:
    hit = _Hits(0)
    for number, text in guess.evidence:
        hit.add(number, text)
    return _answer(
        hit,
        rule=f"wording:{guess.category}",
        category=guess.category,
        title=(
            f"Reads most like the known {guess.category} failures (by the words of its failure "
            "lines; no rule, code or known wording matched)"
        ),
        remedy=wording.remedy(guess.category),
        explanation=(
            "No rule, published code or known wording named a cause. The words of this log's "
            f"failure lines are closest to those of the {guess.category} failures in the "
            f"console's corpus of real logs ({_odds(guess.lead)} than the next, "
            f"{guess.runner_up}); check the lines shown before acting on it."
        ),
        priority=10,
        confidence="low",
    )


def _lines_hit(lines: list[tuple[int, str]]) -> _Hits:
    hit = _Hits(0)
    for number, text in lines:
        hit.add(number, text)
    return hit


def _unread_error(lines: list[tuple[int, str]]) -> Diagnosis:
    """Error lines nothing reads (a component's own wording, its own code): not an empty answer,
    but a symptom saying so, the lines as evidence, and what to collect next."""
    return _answer(
        _lines_hit(lines),
        rule="unread-error",
        category=SYMPTOM_CATEGORY,
        severity="warning",
        title="The log reports an error no rule, code table or known wording explains",
        remedy=(
            "Read the error lines shown and the component's own log they point to (MindIE: "
            "$MINDIE_LOG_PATH, CANN: the plog), and search its code or message there."
        ),
        explanation=(
            "These lines report a failure (an error level or a failure word, not a warning), "
            "but no rule, published code or known wording matches them: the console cannot "
            "say what caused it, only where the log says something failed."
        ),
        priority=5,
        confidence="low",
        symptom=True,
        collect_next=COLLECT_NEXT,
    )


def _quiet_log(last_lines: list[tuple[int, str]]) -> Diagnosis:
    return _answer(
        _lines_hit(last_lines),
        rule="no-error-line",
        category="engine-hang",
        severity="warning",
        title="No error in this log: if the engine stopped here, it is stuck (a hang)",
        remedy=(
            "Find where it waits while it hangs: `py-spy dump --pid <pid>` of every engine "
            "process, and `npu-smi info` for its NPUs' activity (and the rest of what to "
            "collect, above)."
        ),
        explanation=(
            "No rule, code or known wording matched, and no line of the log reports an error: "
            "only progress, INFO/DEBUG lines and warnings. A failing engine says why before it "
            "exits; one that stops making progress says nothing. Its last lines (shown) are "
            "where it stopped — loading weights, compiling or capturing graphs, waiting on a "
            "collective, or serving requests at 0 tokens/s."
        ),
        priority=5,
        confidence="low",
        collect_next=QUIET_COLLECT_NEXT,
    )


def _odds(lead: float) -> str:
    """A log-likelihood lead as words: 'about 740 times likelier'."""
    if lead > math.log(1e6):
        return "over a million times likelier"
    return f"about {math.exp(lead):,.0f} times likelier"
