"""Cells, header names and typed values of `npu-smi info` table rows.

Columns are found by their header names (split on `|`, then on runs of spaces), never by
character offsets: npu-smi 26.0 widened the columns and the older releases differ too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..base import NpuChip, NpuProcess, ParseError

Headers = tuple[tuple[str, ...], ...]

# Header names are separated by 2+ spaces, except after a unit: "NPU Util(%) Memory-Usage(MB)"
# (Ascend 950) has a single space. Names themselves may hold one space ("NPU ID").
_HEADER_SPLIT = re.compile(r"\s{2,}|(?<=\))\s+")
# A value is one word, or "used / total" with any spacing: "0    / 0", "59891/ 65536".
_VALUE = re.compile(r"\d+\s*/\s*\d+|\S+")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_INT = re.compile(r"\d+")
# npu-smi prints NA when a query fails (Power on 300I Duo) and "-" for the second die
# of an A3 NPU; both mean "not reported".
_MISSING = frozenset({"NA", "-"})
# Columns whose value is the rest of its cell and may contain spaces.
_TEXT_COLUMNS = frozenset({"Name", "Health", "Process name"})


@dataclass(slots=True)
class Row:
    """One `|`-delimited line: cells between the bars, and whether it ended with `|`."""

    line_no: int
    text: str
    cells: list[str]
    complete: bool

    @classmethod
    def parse(cls, line_no: int, line: str) -> Row:
        complete = len(line) > 1 and line.endswith("|")
        body = line[1:-1] if complete else line[1:]
        return cls(line_no, line, body.split("|"), complete)

    def error(self, reason: str) -> ParseError:
        return ParseError(reason, self.line_no, self.text)

    def first_cell(self) -> str:
        return self.cells[0].strip()


def header_cells(row: Row) -> Headers:
    """Header names of each cell of a header row, e.g. (("NPU", "Name"), ("Health",))."""
    return tuple(
        tuple(name for name in _HEADER_SPLIT.split(cell.strip()) if name) for cell in row.cells
    )


def _int(token: str) -> int:
    if not _INT.fullmatch(token):
        raise ValueError(f"expected a whole number, got {token!r}")
    return int(token)


def _optional_int(token: str) -> int | None:
    return None if token in _MISSING else _int(token)


def _number(token: str) -> float | None:
    if token in _MISSING:
        return None
    if not _NUMBER.fullmatch(token):
        raise ValueError(f"expected a number, got {token!r}")
    return float(token)


def _pair(token: str) -> tuple[int | None, int | None]:
    if token in _MISSING:
        return None, None
    match = _PAIR.fullmatch(token)
    if match is None:
        raise ValueError(f"expected 'used / total', got {token!r}")
    return int(match[1]), int(match[2])


def _text(token: str) -> str | None:
    return token or None


def _optional_text(token: str) -> str | None:
    return None if token in _MISSING else _text(token)


_Converter = Callable[[str], Any]
# header name -> (field name(s) of NpuChip / NpuProcess, converter). Unknown headers are
# read (so the cell count still has to fit) but not kept.
FIELDS: dict[str, tuple[str | tuple[str, str], _Converter]] = {
    "NPU": ("npu_id", _int),
    "NPU ID": ("npu_id", _int),
    "Chip": ("chip_id", _int),
    "Device": ("device_id", _optional_int),
    "Phy-ID": ("phy_id", _optional_int),
    "Name": ("name", _text),
    "Health": ("health", _text),
    "Bus-Id": ("bus_id", _optional_text),
    "Power(W)": ("power_w", _number),
    "Temp(C)": ("temperature_c", _number),
    "AICore(%)": ("aicore_percent", _number),
    "NPU Util(%)": ("aicore_percent", _number),
    "Hugepages-Usage(page)": (("hugepages_used", "hugepages_total"), _pair),
    "Memory-Usage(MB)": (("memory_used_mb", "memory_total_mb"), _pair),
    "HBM-Usage(MB)": (("hbm_used_mb", "hbm_total_mb"), _pair),
    "Process id": ("pid", _int),
    "Process name": ("name", _text),
    "Process memory(MB)": ("memory_mb", _optional_int),
    "Process id in container": ("container_pid", _optional_int),
}


def _cell_tokens(row: Row, cell: str, names: tuple[str, ...]) -> list[str]:
    matches = list(_VALUE.finditer(cell))
    tokens = [match[0] for match in matches]
    if names and names[-1] in _TEXT_COLUMNS and len(tokens) >= len(names) - 1:
        head = len(names) - 1
        rest = cell[matches[head].start() :].strip() if len(matches) > head else ""
        tokens = tokens[:head] + [rest]
    if len(tokens) != len(names):
        raise row.error(
            f"cell {cell.strip()!r} has {len(tokens)} values where the header"
            f" {' / '.join(names) or '(empty)'} has {len(names)}"
        )
    return tokens


def row_values(row: Row, headers: Headers) -> dict[str, Any]:
    """Typed values of a data row, keyed by NpuChip/NpuProcess field name.

    Raises ParseError naming the row if it is cut off, has another number of cells
    than its header, or holds a non-number where the column needs one.
    """
    if not row.complete:
        raise row.error("row is cut off (no closing '|')")
    if len(row.cells) != len(headers):
        raise row.error(f"expected {len(headers)} cells, found {len(row.cells)}")
    values: dict[str, Any] = {}
    for cell, names in zip(row.cells, headers, strict=True):
        for name, token in zip(names, _cell_tokens(row, cell, names), strict=True):
            if name not in FIELDS:
                continue
            target, convert = FIELDS[name]
            try:
                value = convert(token)
            except ValueError as exc:
                raise row.error(f"column {name}: {exc}") from None
            if isinstance(target, tuple):
                values.update(zip(target, value, strict=True))
            else:
                values[target] = value
    return values


def names_in(headers: Headers) -> set[str]:
    """All header names of a row, whatever cell they are in."""
    return {name for cell in headers for name in cell}


@dataclass(frozen=True, slots=True)
class DeviceLayout:
    """Header names of the two lines every chip occupies in the device table."""

    row1: Headers
    row2: Headers

    @classmethod
    def from_header(cls, row1: Row, row2: Row) -> DeviceLayout:
        layout = cls(header_cells(row1), header_cells(row2))
        if not names_in(layout.row1) & {"NPU", "NPU ID"}:
            raise row1.error("npu-smi table header has no NPU column")
        return layout

    def chip(self, row1: Row, row2: Row) -> NpuChip:
        """The chip described by one row pair (ParseError if the rows do not fit)."""
        values = row_values(row1, self.row1) | row_values(row2, self.row2)
        # Ascend 950 has no Chip column: one chip per NPU, reported as chip 0.
        values.setdefault("chip_id", 0)
        return NpuChip(**values)


@dataclass(frozen=True, slots=True)
class ProcessLayout:
    """Header names of the process table (4 or 5 cells depending on the release)."""

    cells: Headers

    @classmethod
    def from_header(cls, row: Row) -> ProcessLayout:
        layout = cls(header_cells(row))
        names = names_in(layout.cells)
        if not names & {"NPU", "NPU ID"} or "Process id" not in names:
            raise row.error("process table header lacks NPU or Process id")
        return layout

    def process(self, row: Row) -> NpuProcess:
        """The process one row describes (ParseError if the row does not fit)."""
        values = row_values(row, self.cells)
        values.setdefault("chip_id", None)  # Ascend 950: "NPU ID" only
        values["name"] = values.get("name") or ""
        return NpuProcess(**values)
