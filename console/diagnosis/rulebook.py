"""The diagnosis rule base: YAML files under `rules/`, validated with pydantic and compiled once.

A rule file holds `rules:` (and, only when it needs one, `categories:` — a new category with the
reason it exists). `load_rulebook()` reads every file, checks every rule (unique id, known
category, regexes that RE2 — a linear-time engine — accepts, a numbered remediation, at least one sample and one
counter-sample) and raises `RuleFileError` naming the file and the rule id on the first problem.
Pure Python: no database, no Django.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

import re2
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

RULES_DIR = Path(__file__).resolve().parent / "rules"
KNOWLEDGE_FILE = Path(__file__).resolve().parent / "data" / "knowledge.yaml"

# The fixed vocabulary. A rule file may add one only with a written reason (`categories:`).
CATEGORIES = (
    "npu-oom",
    "kv-cache-insufficient",
    "npu-init-failure",
    "driver-missing",
    "version-mismatch",
    "op-unsupported",
    "hccl-failure",
    "device-busy",
    "npu-health",
    "over-temperature",
    "port-in-use",
    "model-not-found",
    "config-invalid",
    "remote-code-required",
    "host-oom",
    "engine-hang",
    "engine-crash",
)
SEVERITIES = ("info", "warning", "critical")
HEALTH_VALUES = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")
ANY_OTHER = "*"  # consequence_of: ["*"] = ranks below any other category that matched
_TELEMETRY = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*(>=|<=|==|>|<)\s*(-?\d+(?:\.\d+)?)\s*$")
_OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt}


class RuleFileError(Exception):
    """A rule file that cannot be used; the message names the file and, where known, the rule."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Link(_Strict):
    title: str
    url: str = Field(pattern=r"^https://")


class Sample(_Strict):
    """Input a rule must (samples) or must not (counter_samples) match.

    Either a fixture `file` (tests/fixtures/ascend or tests/fixtures/engine), or `text` quoted
    from a real log or a real source (with `source` saying where), and/or the non-log inputs.
    `top: true` marks the sample where this rule's category must rank first."""

    file: str | None = None
    text: str | None = None
    source: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    health: str | None = None
    telemetry: dict[str, float] | None = None
    top: bool = False

    @model_validator(mode="after")
    def _has_input(self):
        inputs = (self.file, self.text, self.exit_code, self.signal, self.health, self.telemetry)
        if all(v is None for v in inputs):
            raise ValueError("a sample needs a file, a text or a non-log input")
        if self.file is None and not self.source:
            raise ValueError("a sample without a fixture file must say its source")
        return self


class Matchers(_Strict):
    """What fires a rule. Any one trigger is enough: a log line matching `patterns` or `codes`
    (then every `requires` regex must also match some line), an exit code, a signal, an npu-smi
    health value, or a telemetry condition such as `temperature_c >= 85`."""

    patterns: list[str] = []
    codes: list[str] = []
    requires: list[str] = []
    exit_codes: list[int] = []
    signals: list[int] = []
    health: list[Literal["OK", "Warning", "Alarm", "Critical", "UNKNOWN"]] = []
    telemetry: list[str] = []

    @field_validator("patterns", "requires")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                compile_linear(pattern)
            except re2.error as exc:
                raise ValueError(
                    f"regex {pattern!r} is not accepted by the linear-time engine (RE2: no "
                    f"look-around, no back-references): {exc}"
                ) from None
        return value

    @field_validator("codes")
    @classmethod
    def _code_shape(cls, value: list[str]) -> list[str]:
        for code in value:
            if not re.fullmatch(r"[A-Z]{2}\d{4}|\d{6}|ERR\d{5}", code):
                raise ValueError(f"code {code!r} is not like EZ9999, 507033 or ERR99999")
        return value

    @field_validator("telemetry")
    @classmethod
    def _conditions(cls, value: list[str]) -> list[str]:
        for cond in value:
            if not _TELEMETRY.match(cond):
                raise ValueError(f"telemetry condition {cond!r} is not like 'temperature_c >= 85'")
        return value

    @model_validator(mode="after")
    def _has_trigger(self):
        triggers = (self.patterns, self.codes, self.exit_codes, self.signals)
        if not any(triggers) and not self.health and not self.telemetry:
            raise ValueError("a rule needs at least one trigger")
        if self.requires and not (self.patterns or self.codes):
            raise ValueError("`requires` only narrows `patterns`/`codes`")
        return self


class Rule(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    category: str
    title: str = Field(min_length=3)
    severity: Literal["info", "warning", "critical"]
    priority: int = Field(default=50, ge=0, le=100)
    consequence_of: list[str] = []
    match: Matchers
    explanation: str = Field(min_length=20)
    remediation: list[str] = Field(min_length=1)
    links: list[Link] = []
    samples: list[Sample] = Field(min_length=1)
    counter_samples: list[Sample] = Field(min_length=1)
    note: str | None = None  # why a rule is shaped the way it is (shown on the rules page)


class CategoryExtension(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z-]*$")
    reason: str = Field(min_length=20)


class RuleFile(_Strict):
    categories: list[CategoryExtension] = []
    rules: list[dict] = Field(min_length=1)


class KnowledgeEntry(_Strict):
    id: str
    claim: str
    verdict: str
    truth: str
    source: str
    rule: str | None = None  # a rule that recognises the failure this claim leads to


@dataclass(frozen=True)
class CompiledRule:
    """A validated rule with its regexes compiled (what the matcher runs)."""

    rule: Rule
    file: str
    line_regexes: tuple[str, ...]  # RE2 syntax; run together in the book's LineIndex
    requires: tuple[str, ...]
    telemetry: tuple[tuple[str, str, float], ...] = field(default=())

    @property
    def id(self) -> str:
        return self.rule.id

    def telemetry_hits(self, values: dict[str, float]) -> list[str]:
        hits = []
        for name, op, threshold in self.telemetry:
            value = values.get(name)
            if value is not None and _OPS[op](float(value), threshold):
                hits.append(f"telemetry {name} = {value:g} ({op} {threshold:g})")
        return hits


@dataclass(frozen=True)
class Target:
    """What one pattern of the LineIndex stands for: rule `rule`'s trigger (`require` None)
    or its `require`-th `requires` regex."""

    rule: int
    require: int | None


class LineIndex:
    """Every rule regex in one RE2 set: one linear-time pass per line says which of them
    match (RE2 builds one automaton for all; no pattern can backtrack). Extra patterns (the
    code and exception recognisers) ride in the same pass; `match` returns their names."""

    def __init__(self, targets: list[tuple[str, Target | str]]) -> None:
        self._set = re2.Set.SearchSet(_options())
        self.targets: list[Target | str] = []
        for pattern, target in targets:
            if self._set.Add(pattern) != len(self.targets):
                raise RuleFileError(f"regex {pattern!r} was not accepted by the RE2 set")
            self.targets.append(target)
        if self.targets:
            self._set.Compile()

    def match(self, line: str) -> list[Target | str]:
        if not self.targets:
            return []
        return [self.targets[i] for i in self._set.Match(line) or ()]


@dataclass(frozen=True)
class RuleBook:
    rules: tuple[CompiledRule, ...]
    categories: dict[str, str]  # name -> reason ("" for the fixed vocabulary)
    index: LineIndex = field(default_factory=lambda: LineIndex([]))

    def by_id(self, rule_id: str) -> CompiledRule:
        for compiled in self.rules:
            if compiled.id == rule_id:
                return compiled
        raise KeyError(rule_id)


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = 256 << 20  # the set's automaton: a too-small budget would miss matches
    options.log_errors = False
    return options


def compile_linear(pattern: str):
    """A regex compiled by RE2: matching time linear in the line, whatever the line."""
    return re2.compile(pattern, _options())


def _codes_regex(codes: list[str]) -> str:
    alternatives = "|".join(re2.escape(c) for c in codes)
    return rf"(?:^|[^0-9A-Za-z])(?:{alternatives})(?:[^0-9A-Za-z]|$)"


def compile_rule(rule: Rule, file: str) -> CompiledRule:
    regexes = list(rule.match.patterns)
    if rule.match.codes:
        regexes.append(_codes_regex(rule.match.codes))
    telemetry = []
    for cond in rule.match.telemetry:
        name, op, value = _TELEMETRY.match(cond).groups()
        telemetry.append((name, op, float(value)))
    return CompiledRule(
        rule=rule,
        file=file,
        line_regexes=tuple(regexes),
        requires=tuple(rule.match.requires),
        telemetry=tuple(telemetry),
    )


def build_index(rules: tuple[CompiledRule, ...], extra: dict[str, str] | None = None) -> LineIndex:
    """One RE2 set over every rule's trigger and `requires` regexes, plus `extra` (name ->
    pattern) recognisers."""
    targets: list[tuple[str, Target | str]] = []
    for i, rule in enumerate(rules):
        targets += [(pattern, Target(i, None)) for pattern in rule.line_regexes]
        targets += [(pattern, Target(i, k)) for k, pattern in enumerate(rule.requires)]
    targets += [(pattern, name) for name, pattern in (extra or {}).items()]
    return LineIndex(targets)


def _read_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RuleFileError(f"{path.name}: cannot read YAML: {exc}") from None


def _error_text(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'rule'}: {e['msg']}" for e in exc.errors()
    )


def load_rules(directory: Path = RULES_DIR) -> RuleBook:
    """Read and validate every `*.yaml` under `directory`. Raises RuleFileError naming the
    file and the rule id on the first problem; never returns a partial rule book."""
    parsed: list[tuple[str, Rule]] = []
    categories = {name: "" for name in CATEGORIES}
    for path in sorted(directory.glob("*.yaml")):
        try:
            rule_file = RuleFile.model_validate(_read_yaml(path))
        except ValidationError as exc:
            raise RuleFileError(f"{path.name}: {_error_text(exc)}") from None
        for ext in rule_file.categories:
            if ext.name in categories:
                raise RuleFileError(f"{path.name}: category {ext.name!r} already exists")
            categories[ext.name] = ext.reason
        for index, raw in enumerate(rule_file.rules):
            rule_id = raw.get("id", f"#{index + 1}") if isinstance(raw, dict) else f"#{index + 1}"
            try:
                parsed.append((path.name, Rule.model_validate(raw)))
            except ValidationError as exc:
                raise RuleFileError(f"{path.name}: rule {rule_id}: {_error_text(exc)}") from None
    if not parsed:
        raise RuleFileError(f"{directory}: no rule files")
    compiled = _check_and_compile(parsed, categories)
    return RuleBook(rules=compiled, categories=categories, index=build_index(compiled))


def _check_and_compile(parsed: list[tuple[str, Rule]], categories: dict[str, str]):
    seen: dict[str, str] = {}
    compiled = []
    for file, rule in parsed:
        where = f"{file}: rule {rule.id}"
        if rule.id in seen:
            raise RuleFileError(f"{where}: duplicate id (also in {seen[rule.id]})")
        seen[rule.id] = file
        if rule.category not in categories:
            raise RuleFileError(f"{where}: unknown category {rule.category!r}")
        for name in rule.consequence_of:
            if name != ANY_OTHER and name not in categories:
                raise RuleFileError(f"{where}: consequence_of names unknown category {name!r}")
        if not any(s.top for s in rule.samples):
            raise RuleFileError(f"{where}: no sample is marked `top: true`")
        compiled.append(compile_rule(rule, file))
    return tuple(compiled)


@cache
def rulebook() -> RuleBook:
    """The rule base shipped with the console, loaded once per process."""
    return load_rules()


@cache
def knowledge() -> tuple[KnowledgeEntry, ...]:
    """Seed claims checked against real sources (the knowledge-base page lists them)."""
    data = _read_yaml(KNOWLEDGE_FILE) or {}
    try:
        return tuple(KnowledgeEntry.model_validate(e) for e in data.get("entries", []))
    except ValidationError as exc:
        raise RuleFileError(f"{KNOWLEDGE_FILE.name}: {_error_text(exc)}") from None
