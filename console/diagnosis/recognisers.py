"""Recognisers for what no rule was written for: the exception a Python traceback ends with,
the message of an ERROR / failed line, and the published Ascend codes (codes.py).

A rule (rules/*.yaml) knows one failure well; these know the *vocabulary* of failures
(data/vocabulary.yaml): an exception class and the words of its message name a category even in
a wording never seen. Their answers rank below a rule's (confidence "medium" for an exception or
an exact code, "low" for an error line or a code known only by its class), and a generic
exception with no known words is a symptom — it never outranks a cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from console.diagnosis.rulebook import RuleFileError, compile_linear

VOCABULARY = Path(__file__).resolve().parent / "data" / "vocabulary.yaml"

# The last line of a traceback: a dotted CamelCase class ending in Error/Exception/…, then ": ".
# Logging prefixes come first ("(EngineCore pid=1) ERROR 05-01 12:00:00 [core.py:1] ValueError:
# …"), so the class may follow any character that cannot be part of a dotted name: a space, a
# bracket, a colon, a quote — or a full-width colon or CJK text ("报错如下：AttributeError: …").
# A class without such an ending counts when it is module-qualified (huggingface_hub.utils.
# OfflineModeIsEnabled: …). Pasted logs often quote it in backticks.
EXCEPTION = (
    r"(?:^|[^\w.])((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Timeout|Failure|"
    r"NotFound)|(?:[a-z_]\w*\.)+[A-Z]\w*)(?:\([^)]{0,80}\))?(?::\s*(.*)|$)"
)
# An error line that is not a traceback's end: a log level or a failure word. The level may be
# glog's or c10's ("E0331 20:50:12", "[E331 20:50:12…"); "…Error:" counts even glued to a
# mistyped class ("0SError: …"); the loader's and Python's import wordings, pip's resolver's
# ("conflicting dependencies"), and Chinese reporters' words (报错 "an error is reported",
# 失败 "failed", 不匹配/不兼容/不支持 "does not match / incompatible / not supported") count too;
# so do the linker's missing library ("ld: cannot find -lcuda") and a component "too old" for
# the rest of the stack (PyTorch warns "The NVIDIA driver on your system is too old"); so do an
# upper-case OOM (Ray's memory monitor: "killed due to memory pressure (OOM)"), a kill by
# SIGKILL (the shell's bare "Killed", "signal 9", torch elastic's "exitcode: -9": the OOM
# killer's signature), a missing command, and pydantic's line for a refused value
# ("  Value error, …", read as a setting by read_line; vLLM may put its process before it).
VALUE_ERROR = r"^(?:\([^()]{1,60}\))?\s*Value error, "
ERROR_LINE = (
    r"(?:\bERROR\b|\[ERROR\]|\bFATAL\b|\bCRITICAL\b|\bOOM\b|" + VALUE_ERROR + r"|^\s*Killed\s*$|"
    r"\bE\d{4} |"
    r"\b[EF]\d{3,4} \d\d:\d\d:\d\d|"
    r"\b[EW][0-9A-Z]\d{4}[:\[]|报错|错误|失败|不匹配|不兼容|不支持|"
    r"(?i:\bfailed\b|\bfailure\b|error:|\berror code\b|\bexception\b|errorstr|\bsigkill\b|"
    r"signal 9\b|exitcode: -9\b|command not found|"
    r"does not match|mismatch|cannot open shared object|error while loading shared libraries|"
    r"undefined symbol|no module named|cannot import name|conflict|incompatible|"
    r"not (?:currently |yet )?supported|unsupported|does not support|can ?not be found|"
    r"could not be found|cannot find -l\w|\btoo old\b))"
)


class _Example(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str
    source: str = Field(min_length=3)


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    category: str
    title: str
    classes: str | None = None
    words: str
    remedy: str
    examples: list[_Example] = Field(min_length=1)
    counter: list[_Example] = Field(min_length=1)


@dataclass(frozen=True)
class Word:
    entry: Entry
    classes: object | None  # compiled RE2
    words: object


@dataclass(frozen=True)
class Recognised:
    """One line's reading: the entry whose vocabulary it uses (None: an exception with no
    known words), the exception class if the line ends a traceback, and its message."""

    entry: Entry | None
    exception: str | None
    message: str


@cache
def vocabulary() -> tuple[Word, ...]:
    try:
        raw = yaml.safe_load(VOCABULARY.read_text(encoding="utf-8")) or {}
        entries = [Entry.model_validate(e) for e in raw.get("entries", [])]
    except (ValidationError, yaml.YAMLError) as exc:
        raise RuleFileError(f"{VOCABULARY.name}: {str(exc)[:2000]}") from None
    words = []
    for e in entries:
        try:
            classes = compile_linear(e.classes) if e.classes else None
            words.append(Word(e, classes, compile_linear(f"(?i:{e.words})")))
        except Exception as exc:  # noqa: BLE001 - re2.error: name the entry
            raise RuleFileError(f"{VOCABULARY.name}: entry {e.id}: {exc}") from None
    return tuple(words)


_exception = compile_linear(EXCEPTION)
# pydantic's wording under "N validation error(s) for X": "  Value error, <message> [type=…"
_value_error = compile_linear(VALUE_ERROR)
# pydantic's summary line names only the config class ("1 validation error for ModelConfig"):
# the reason is on the lines after it, so it reads as an error line, not as an exception
_validation_summary = compile_linear(r"^\d+ validation errors? for \w+$")
# a warning about the future ("… is deprecated and will be unsupported in …") is never a cause
_deprecation = compile_linear(r"\b(?:Pending)?DeprecationWarning\b|\bFutureWarning\b")
SETTING = "bad-setting"  # the vocabulary entry of a rejected setting


def _entry(entry_id: str) -> Entry:
    return next(w.entry for w in vocabulary() if w.entry.id == entry_id)


def read_line(line: str, *, error_line: bool) -> Recognised | None:
    """The vocabulary reading of one line: an exception line always gets one (entry None when
    its words are unknown); another line only when it is an error line with known words."""
    m = _exception.search(line)
    if m:
        cls, message = m.group(1).rsplit(".", 1)[-1], (m.group(2) or "").strip()
        if cls == "ValidationError" and _validation_summary.search(message):
            return Recognised(classify(cls, message), None, line.strip())
        return Recognised(classify(cls, message), m.group(1), message)
    if _value_error.search(line):
        # pydantic's line for a value its model refused: vLLM's configs (VllmConfig,
        # ModelConfig, …) are pydantic dataclasses, so this is a rejected setting unless its
        # words name something more specific (the KV cache, a model file). It is the message
        # of the ValueError a validator raised: read as that exception, by its words before
        # pydantic's " [type=…, input_value=…]" (the input's repr: any setting's name)
        message = line.split("Value error, ", 1)[1].split(" [type=", 1)[0].strip()
        entry = classify(None, message) or _entry(SETTING)
        return Recognised(entry, "ValueError", message)
    if error_line and not _deprecation.search(line):
        entry = classify(None, line)
        if entry is not None:
            return Recognised(entry, None, line.strip())
    return None


def classify(cls: str | None, message: str) -> Entry | None:
    for word in vocabulary():
        if cls and word.classes is not None and word.classes.search(cls):
            return word.entry
        if word.words.search(message):
            return word.entry
    return None
