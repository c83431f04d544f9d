"""Match a log (plus exit code, signal, npu-smi health, telemetry) against the rule base.

`diagnose()` is pure Python — no database, no Django — and makes one pass over the lines with
precompiled regexes. It returns the rules that fired, best first, and an empty list when none
did: there is no guess and no catch-all beyond the engine-crash rules, which only fire on real
crash markers (a Python traceback, EngineDeadError, "Engine core initialization failed", …).

Ranking prefers the root cause over its consequences: a rule whose `consequence_of` names the
category of another rule that also fired ranks below it (`*` = any other category); then a
higher `priority` wins; then the rule whose first evidence comes earlier in the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from console.diagnosis.rulebook import ANY_OTHER, HEALTH_VALUES, CompiledRule, RuleBook, rulebook

MAX_EVIDENCE = 5  # lines kept per diagnosis, after de-duplication
MAX_EVIDENCE_CHARS = 400  # a line longer than this is cut (with an ellipsis)
_HEALTH = {v.lower(): v for v in HEALTH_VALUES}


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
        }


class _Hits:
    """Evidence gathered for one rule during the pass."""

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


def _check(rule: CompiledRule, hit: _Hits, number: int, line: str) -> None:
    for regex in rule.line_regexes:
        if regex.search(line):
            hit.matched = True
            hit.add(number, line)
            break
    for k, regex in enumerate(rule.requires):
        if not hit.required[k] and regex.search(line):
            hit.required[k] = True
            hit.add(number, line)
    if hit.matched and len(hit.evidence) >= MAX_EVIDENCE and all(hit.required):
        hit.full = True  # nothing more to learn about this rule


def _scan(lines: list[str], book: RuleBook) -> dict[int, _Hits]:
    """One pass over the lines; returns hits for each rule index whose log trigger fired.
    A rule's regexes run only on lines holding one of their required literals."""
    rules, index = book.rules, book.index
    hits = {i: _Hits(len(r.requires)) for i, r in enumerate(rules) if r.line_regexes}
    keywords, by_keyword = index.keywords, index.rules_by_keyword
    for number, line in enumerate(lines, start=1):
        present = [k for k in keywords if k in line]
        if not present and not index.always:
            continue
        candidates = set(index.always)
        for k in present:
            candidates.update(by_keyword[k])
        for i in candidates:
            hit = hits.get(i)
            if hit is not None and not hit.full:
                _check(rules[i], hit, number, line)
    return {i: h for i, h in hits.items() if h.matched and all(h.required)}


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
) -> list[Diagnosis]:
    """The rules that fired on this evidence, best first; [] when nothing is recognised.

    Pure and deterministic: the same input gives the same list. `telemetry` maps names such
    as `temperature_c` to numbers; `health` is an npu-smi value (OK, Warning, Alarm, Critical,
    UNKNOWN, any case)."""
    book = book or rulebook()
    exit_code, signal, health = _normalise(exit_code, signal, health)
    hits = _scan(text.splitlines(), book)
    found: list[tuple[CompiledRule, _Hits]] = []
    for i, rule in enumerate(book.rules):
        hit = hits.get(i)
        extra = _other_triggers(rule, exit_code, signal, health, telemetry)
        if hit is None and not extra:
            continue
        hit = hit or _Hits(0)
        for line in extra:
            hit.add(None, line)
        found.append((rule, hit))
    return _rank(found)


def _rank(found: list[tuple[CompiledRule, _Hits]]) -> list[Diagnosis]:
    categories = {rule.rule.category for rule, _ in found}

    def demoted(rule: CompiledRule) -> bool:
        others = categories - {rule.rule.category}
        causes = set(rule.rule.consequence_of)
        return bool(others & causes) or (ANY_OTHER in causes and bool(others))

    def key(item):
        rule, hit = item
        first = hit.first if hit.first is not None else float("inf")
        return (demoted(rule), -rule.rule.priority, first, rule.id)

    return [_diagnosis(rule, hit) for rule, hit in sorted(found, key=key)]


def _diagnosis(compiled: CompiledRule, hit: _Hits) -> Diagnosis:
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
    )
