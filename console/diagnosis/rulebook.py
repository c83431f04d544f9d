"""The diagnosis rule base: YAML files under `rules/`, validated with pydantic and compiled once.

A rule file holds `rules:` (and, only when it needs one, `categories:` — a new category with the
reason it exists). `load_rulebook()` reads every file, checks every rule (unique id, known
category, regexes that compile, a numbered remediation, at least one sample and one
counter-sample) and raises `RuleFileError` naming the file and the rule id on the first problem.
Pure Python: no database, no Django.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from re import _constants as sre_constants  # CPython's regex parser: only for the speed-up
from re import _parser as sre_parser
from typing import Literal

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
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"regex {pattern!r} does not compile: {exc}") from None
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
    line_regexes: tuple[re.Pattern, ...]
    requires: tuple[re.Pattern, ...]
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
class KeywordIndex:
    """A literal that each regex needs, so the matcher runs a rule's regexes only on lines
    containing one of its literals (`in` is far cheaper than a regex search)."""

    keywords: tuple[str, ...]
    rules_by_keyword: dict[str, tuple[int, ...]]
    always: tuple[int, ...]  # rules with a regex no literal could be drawn from


@dataclass(frozen=True)
class RuleBook:
    rules: tuple[CompiledRule, ...]
    categories: dict[str, str]  # name -> reason ("" for the fixed vocabulary)
    index: KeywordIndex = field(default_factory=lambda: KeywordIndex((), {}, ()))

    def by_id(self, rule_id: str) -> CompiledRule:
        for compiled in self.rules:
            if compiled.id == rule_id:
                return compiled
        raise KeyError(rule_id)


def _codes_regex(codes: list[str]) -> re.Pattern:
    alternatives = "|".join(re.escape(c) for c in codes)
    return re.compile(rf"(?<![0-9A-Za-z])(?:{alternatives})(?![0-9A-Za-z])")


def compile_rule(rule: Rule, file: str) -> CompiledRule:
    regexes = [re.compile(p) for p in rule.match.patterns]
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
        requires=tuple(re.compile(p) for p in rule.match.requires),
        telemetry=tuple(telemetry),
    )


def _literal_runs(items) -> list[str]:
    runs, current = [], []
    for op, arg in items:
        if op is sre_constants.LITERAL:
            current.append(chr(arg))
            continue
        if current:
            runs.append("".join(current))
            current = []
    if current:
        runs.append("".join(current))
    return runs


def required_literals(pattern: str) -> tuple[str, ...] | None:
    """Literals of which every match of `pattern` contains at least one, or None when none
    can be drawn (then the regex runs on every line). Only a speed-up: never changes results."""
    try:
        parsed = sre_parser.parse(pattern)
        if parsed.state.flags & re.IGNORECASE:
            return None
        items = list(parsed)
        single_branch = len(items) == 1 and items[0][0] is sre_constants.BRANCH
        branches = items[0][1][1] if single_branch else [items]
        found = []
        for branch in branches:
            best = max(_literal_runs(branch), key=len, default="")
            if len(best) < 3:
                return None
            found.append(best)
        return tuple(found)
    except Exception:  # noqa: BLE001 - an internal API changed: fall back to always running
        return None


def build_index(rules: tuple[CompiledRule, ...]) -> KeywordIndex:
    by_keyword: dict[str, set[int]] = {}
    always: set[int] = set()
    for i, rule in enumerate(rules):
        for regex in rule.line_regexes + rule.requires:
            literals = required_literals(regex.pattern)
            if literals is None:
                always.add(i)
                continue
            for literal in literals:
                by_keyword.setdefault(literal, set()).add(i)
    return KeywordIndex(
        keywords=tuple(sorted(by_keyword)),
        rules_by_keyword={k: tuple(sorted(v)) for k, v in by_keyword.items()},
        always=tuple(sorted(always)),
    )


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
