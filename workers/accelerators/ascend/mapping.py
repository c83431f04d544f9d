"""Parser for `npu-smi info -m` (NPU id / chip id -> logical id mapping).

Logical ids are what ASCEND_RT_VISIBLE_DEVICES and torch_npu count; they differ from
the NPU ids of `npu-smi info` (which need not start at 0 nor be contiguous).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..base import ParseError

_COLUMN_SPLIT = re.compile(r"\s{2,}")
_REQUIRED = ("NPU ID", "Chip ID", "Chip Name")
_FIELDS = {
    "NPU ID": "npu_id",
    "Chip ID": "chip_id",
    "Chip Logic ID": "logic_id",
    "Chip Phy-ID": "phy_id",  # Ascend 950
    "Slot ID": "slot_id",  # Ascend 950
}


@dataclass(slots=True)
class NpuMapEntry:
    """One row of `npu-smi info -m`; logic_id is None for MCU rows and on Ascend 950
    (whose table has no Chip Logic ID column)."""

    npu_id: int
    chip_id: int
    chip_name: str
    logic_id: int | None = None
    phy_id: int | None = None
    slot_id: int | None = None

    @property
    def is_mcu(self) -> bool:
        return self.chip_name.lower() == "mcu"


def _entry(line_no: int, line: str, columns: list[str]) -> NpuMapEntry:
    values = line.split(None, len(columns) - 1)
    if len(values) != len(columns):
        raise ParseError(f"expected {len(columns)} columns, found {len(values)}", line_no, line)
    fields: dict[str, object] = {"chip_name": values[columns.index("Chip Name")]}
    for column, value in zip(columns, values, strict=True):
        if column not in _FIELDS:
            continue
        if value == "-":
            fields[_FIELDS[column]] = None
        elif value.isdigit():
            fields[_FIELDS[column]] = int(value)
        else:
            raise ParseError(f"{column}: expected a number or '-'", line_no, line)
    if fields.get("npu_id") is None or fields.get("chip_id") is None:
        raise ParseError("NPU ID and Chip ID must be numbers", line_no, line)
    return NpuMapEntry(**fields)  # type: ignore[arg-type]


def parse_npu_smi_map(text: str) -> list[NpuMapEntry]:
    """Rows of every `npu-smi info -m` table in text, in order.

    Columns are located by the header line (`NPU ID  Chip ID  [Chip Logic ID]  Chip
    Name`, 950: `NPU ID  Slot ID  Chip ID  Chip Phy-ID  Chip Name`); a table ends at the
    first line that does not start with a digit. Raises ParseError for a row that does
    not fit its header, and when no table is found.
    """
    entries: list[NpuMapEntry] = []
    columns: list[str] | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("NPU ID"):
            columns = [name for name in _COLUMN_SPLIT.split(line) if name]
            missing = [name for name in _REQUIRED if name not in columns]
            if missing:
                raise ParseError(f"header lacks {', '.join(missing)}", line_no, raw)
        elif columns is not None and line[:1].isdigit():
            entries.append(_entry(line_no, line, columns))
        elif line:
            columns = None
    if not entries:
        raise ParseError("no npu-smi info -m table found")
    return entries
