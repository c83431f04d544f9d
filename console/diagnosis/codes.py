"""The published Ascend error codes, as data: what a code means, its category and what to do.

Three tables under data/codes/, each entry with its source (the file and commit it was read
from) and our own one-line meaning and remedy — the facts come from the tables, the wording is
ours:

- acl.yaml: AscendCL return codes (`aclError`): ACL's own, the runtime codes passed through
  (107xxx, 207xxx, 507xxx, 5079xx) and the graph engine's; plus the class rule by leading digits
  (1 = caller/environment, 2 = resources/unsupported, 3 = business, 5 = internal), so a
  six-digit code missing from the table still gets its class.
- messages.yaml: CANN error-message codes (level letter + module letter + 4 digits: EI0006,
  EZ9999, E40021 …) and the module of each prefix, so an unknown code of a known module still
  gets that module's category.
- dcmi.yaml: DCMI / npu-smi return codes (-8005, -8020, -90xx).
- driver.yaml: the driver's own return codes (drvError_t), as plog lines print them
  (`drvErr=87`, `drvRetCode=14`), keyed DRV-87.

`lookup("507035")` answers the rules page and the API; `find_codes(line)` is the recogniser the
matcher runs on each log line. MindCluster's fault codes (8 hex digits) stay in faultcodes.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

import re2
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from console.diagnosis.rulebook import CATEGORIES, RuleFileError

DATA = Path(__file__).resolve().parent / "data" / "codes"
Kind = Literal["acl", "message", "dcmi", "driver"]
KIND_TITLES = {
    "acl": "AscendCL return code",
    "message": "CANN error-message code",
    "dcmi": "DCMI / npu-smi return code",
    "driver": "Ascend driver return code",
}
TABLES = (
    ("acl", "acl.yaml"),
    ("message", "messages.yaml"),
    ("dcmi", "dcmi.yaml"),
    ("driver", "driver.yaml"),
)
EXTRA_CATEGORIES = ("op-exception", "graph-capture")  # defined in rules/operators.yaml


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Source(_Loose):
    id: str
    title: str
    url: str = Field(pattern=r"^https://")


class Code(_Loose):
    code: str
    name: str = ""
    category: str
    meaning: str = Field(min_length=5, max_length=300)
    remedy: str = Field(min_length=5, max_length=400)
    source: str
    # the code says only that something failed inside (ACLNN_ERR_INNER, a null pointer): the
    # words on its line, or the error before it, say more — it ranks as a module's inner error
    generic: bool = False


class CodeClass(_Loose):
    prefix: str
    meaning: str
    category: str
    source: str | None = None


class Module(_Loose):
    prefix: str
    module: str
    category: str
    source: list[str] = []  # the first names the module; the others hold its codes


class CodeTable(_Loose):
    sources: list[Source]
    codes: list[Code]
    classes: list[CodeClass] = []
    modules: list[Module] = []


@dataclass(frozen=True)
class CodeEntry:
    """What the console knows of one code. `exact` is False when only its class (leading
    digits) or module (prefix) is known: the meaning is the class's, the confidence lower."""

    code: str
    kind: str
    name: str
    category: str
    meaning: str
    remedy: str
    source_title: str
    source_url: str
    exact: bool = True
    generic: bool = False

    @property
    def timeout(self) -> bool:
        """A code that says only that a task ran past its limit (ACL_ERROR_RT_FFTS_PLUS_TIMEOUT …):
        the wait, not what made it wait."""
        return self.name.upper().endswith("TIMEOUT")

    @property
    def inner(self) -> bool:
        """A module's internal-error code (xx9000-xx9999: "Inner Error!") or a code the table
        marks generic: its words say less than the message on its line."""
        if self.generic:
            return True
        return self.kind == "message" and self.code[2:] == "9999"

    def as_dict(self) -> dict:
        return {
            "code": self.code,
            "kind": self.kind,
            "kind_title": KIND_TITLES[self.kind],
            "name": self.name,
            "category": self.category,
            "meaning": self.meaning,
            "remedy": self.remedy,
            "source": {"title": self.source_title, "url": self.source_url},
            "exact": self.exact,
        }


@dataclass(frozen=True)
class CodeBook:
    codes: dict[str, CodeEntry]
    classes: tuple[tuple[str, CodeEntry], ...]  # (leading digits, template), longest first
    modules: dict[str, CodeEntry]  # message prefix ("EI") -> template
    names: dict[str, CodeEntry] = field(default_factory=dict)  # "DRV_ERROR_BUSY" -> its entry

    def lookup(self, code: str) -> CodeEntry | None:
        """The entry for `code` (any case, surrounding space ignored; a driver code also as a log
        prints it, `drvErr=87`, or by its name), or its class's/module's meaning (exact=False),
        or None when nothing is known of it."""
        code = code.strip().upper()
        if code in self.codes:
            return self.codes[code]
        if code in self.names:
            return self.names[code]
        driver = _DRIVER_TYPED.fullmatch(code)
        if driver:
            return self.codes.get(driver_key(driver.group(1)))
        if _ACL_SHAPE.fullmatch(code):
            for prefix, entry in self.classes:
                if code.startswith(prefix):
                    return _derived(entry, code)
        if _MESSAGE_SHAPE.fullmatch(code) and code[:2] in self.modules:
            return _derived(self.modules[code[:2]], code)
        return None

    def __len__(self) -> int:
        return len(self.codes)


def _derived(template: CodeEntry, code: str) -> CodeEntry:
    return CodeEntry(
        code=code,
        kind=template.kind,
        name="",
        category=template.category,
        meaning=template.meaning,
        remedy=template.remedy,
        source_title=template.source_title,
        source_url=template.source_url,
        exact=False,
    )


_ACL_SHAPE = re2.compile(r"[1-5]\d{5}")
# what an on-call engineer may type for a driver code: DRV-87, drvErr=87, drvRetCode 14
_DRIVER_TYPED = re2.compile(
    r"(?:DRV|DRVERR|DRVRETCODE|DRV_RET_CODE|DRVERROR)[-=: ]?(0X[0-9A-F]{1,4}|\d{1,5})"
)
_MESSAGE_SHAPE = re2.compile(r"[EW][0-9A-Z]\d{4}")
_CLASS_REMEDY = (
    "No entry for this exact code: read the plog next to the error "
    "(~/ascend/log/debug/plog/, or $ASCEND_PROCESS_LOG_PATH) for the module's own message."
)


def _table(path: Path) -> CodeTable:
    try:
        table = CodeTable.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (ValidationError, yaml.YAMLError) as exc:
        raise RuleFileError(f"{path.name}: {str(exc)[:2000]}") from None
    known = {*CATEGORIES, *EXTRA_CATEGORIES}
    sources = {s.id for s in table.sources}
    first_id = table.sources[0].id
    for item in (*table.codes, *table.classes, *table.modules):
        if item.category not in known:
            raise RuleFileError(f"{path.name}: {item!r}: unknown category {item.category!r}")
        refs = item.source if isinstance(item.source, list) else [item.source or first_id]
        for ref in refs:
            if ref not in sources:
                raise RuleFileError(f"{path.name}: source {ref!r} is not in `sources`")
    return table


def load(directory: Path = DATA) -> CodeBook:
    codes: dict[str, CodeEntry] = {}
    classes: list[tuple[str, CodeEntry]] = []
    modules: dict[str, CodeEntry] = {}
    names: dict[str, CodeEntry] = {}
    for kind, name in TABLES:
        path = directory / name
        table = _table(path)
        sources = {s.id: s for s in table.sources}
        first = table.sources[0]
        for c in table.codes:
            source = sources[c.source]
            key = c.code.strip().upper()
            if key in codes:
                raise RuleFileError(f"{name}: code {key} listed twice")
            codes[key] = CodeEntry(
                key,
                kind,
                c.name,
                c.category,
                c.meaning,
                c.remedy,
                source.title,
                source.url,
                generic=c.generic,
            )
            if kind == "driver" and c.name:
                names.setdefault(c.name.upper(), codes[key])
        for cls in table.classes:
            source = sources[cls.source] if cls.source else first
            entry = CodeEntry(
                cls.prefix,
                kind,
                "",
                cls.category,
                cls.meaning,
                _CLASS_REMEDY,
                source.title,
                source.url,
            )
            classes.append((cls.prefix, entry))
        for mod in table.modules:
            source = sources[mod.source[0]] if mod.source else first
            meaning = f"A code of the {mod.module} module of CANN."
            entry = CodeEntry(
                mod.prefix, kind, "", mod.category, meaning, _CLASS_REMEDY, source.title, source.url
            )
            modules[mod.prefix.upper()] = entry
    classes.sort(key=lambda item: -len(item[0]))
    return CodeBook(codes=codes, classes=tuple(classes), modules=modules, names=names)


@cache
def codebook() -> CodeBook:
    return load()


# --- the recogniser ------------------------------------------------------------------------------
# Where a code sits in a log line, by shape. A bare six-digit number is everywhere in logs (pids,
# timestamps, sizes), so an ACL code counts only after a word that introduces an error code
# ("error code", "ret", "errorCode=", "aclError", "ERROR:") and only when the table or its class
# knows it. Message codes (EZ9999) and DCMI codes (-8005) have shapes of their own.
MESSAGE_CODE = re2.compile(r"(?:^|[^0-9A-Za-z])([EW][0-9A-Z]\d{4})(?:[^0-9A-Za-z]|$)")
ACL_CODE = re2.compile(
    r"(?i)(?:error[ _]?code|errcode|err[ _]?no|ret(?:urn)?(?:[ _]?code)?|acl[ _]?error|"
    r"error|status|code|reason)\W{0,8}(?:is\W{0,4})?(?:0x)?([1-5]\d{5})(?:[^0-9A-Za-z]|$)"
)
DCMI_CODE = re2.compile(r"(?i)(?:dcmi|npu-smi|ret|error|code|failed)[^\n]{0,60}?(-[89]0\d\d)\b")
# the driver's drvError_t as the runtime's and the driver's plog lines print it
DRIVER_CODE = re2.compile(
    r"(?i)\b(?:drvErr|drvRetCode|drv_ret_code|drvRet|drv_ret|drvError|drv_err)\s{0,2}[=:]\s{0,2}"
    r"(0x[0-9a-f]{1,4}|\d{1,5})\b"
)
KEYWORDS = (
    "E",
    "W",
    "rror",
    "ret",
    "RET",
    "code",
    "CODE",
    "dcmi",
    "npu-smi",
    "status",
    "reason",
    "drv",
)


def find_codes(line: str, book: CodeBook | None = None) -> list[CodeEntry]:
    """The known codes in one log line, in order of appearance, each once."""
    book = book or codebook()
    found: dict[str, CodeEntry] = {}
    for m in MESSAGE_CODE.finditer(line):
        _add(book, m.group(1), found)
    for m in ACL_CODE.finditer(line):
        _add(book, m.group(1), found)
    if "-8" in line or "-9" in line:
        for m in DCMI_CODE.finditer(line):
            _add(book, m.group(1), found)
    if "drv" in line or "DRV" in line:
        for m in DRIVER_CODE.finditer(line):
            _add(book, driver_key(m.group(1)), found)
    return list(found.values())


def driver_key(number: str) -> str:
    """`87` or `0xfffe` as a driver code's key: DRV-87, DRV-65534."""
    return f"DRV-{int(number, 16) if number.lower().startswith('0x') else int(number)}"


def _add(book: CodeBook, code: str, found: dict[str, CodeEntry]) -> None:
    if code not in found:
        entry = book.lookup(code)
        if entry is not None:
            found[code] = entry
