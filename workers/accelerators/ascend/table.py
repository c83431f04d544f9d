"""Parser for the tables `npu-smi info` prints (device table, then process table).

Every family in samples/README.md A.1 is read from its own header rows: 310/310P/300I Duo,
910/910B, A3 (two dies per NPU), Ascend 950 and the wide npu-smi 26.0 layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..base import NpuChip, NpuProcess, NpuSmiReport, ParseError
from .columns import DeviceLayout, ProcessLayout, Row, header_cells, names_in
from .layouts import layout_from_rows, layout_from_second_header

_BORDER = re.compile(r"\+[-=+]*")
_BANNER = re.compile(r"npu-smi\s+\S+\s+Version:\s*(\S+)")
_NO_PROCESSES = "No running processes found in NPU"


@dataclass(slots=True)
class _Block:
    """Consecutive `|` rows; `closed` when a `+---`/`+===` border line follows them."""

    rows: list[Row]
    closed: bool


def _blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    rows: list[Row] = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("|"):
            rows.append(Row.parse(line_no, line))
        elif rows:
            blocks.append(_Block(rows, closed=bool(_BORDER.fullmatch(line))))
            rows = []
    if rows:
        blocks.append(_Block(rows, closed=False))
    return blocks


def parse_npu_smi_info(text: str) -> NpuSmiReport:
    """Read the output of `npu-smi info` into an NpuSmiReport.

    Guarantees: every chip of the device table is returned in output order, with the
    values as printed (NA and "-" become None); lines starting with '#' and any text
    around the table are ignored; a cut-off tail (the input ends inside the last block,
    as in a pasted excerpt) is dropped, and so is a lone chip line that an excerpt
    without any header starts with. Anything else that cannot be read raises
    ParseError naming the line: a row with the wrong number of cells or values, a
    non-number where a number belongs, a row not closed by a border line in the middle
    of the table, text with no npu-smi table ("no npu-smi table found").
    """
    blocks = _blocks(text)
    reader = _TableReader()
    for index, block in enumerate(blocks):
        is_last = index == len(blocks) - 1
        if not block.closed and not is_last:
            raise block.rows[-1].error("table row not followed by a border line")
        reader.feed(block, tail=is_last and not block.closed)
    return reader.report()


def _is_data(row: Row) -> bool:
    return row.first_cell()[:1].isdigit()


class _TableReader:
    """Walks the blocks in order: banner, device header, chips, process table."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.device: DeviceLayout | None = None
        self.process: ProcessLayout | None = None
        self.chips: list[NpuChip] = []
        self.processes: list[NpuProcess] = []
        self.anchor: Row | None = None  # first line recognised as npu-smi's

    def feed(self, block: _Block, tail: bool) -> None:
        first = block.rows[0]
        banner = _BANNER.search(first.text) if len(first.cells) == 1 else None
        if banner and len(block.rows) == 1:
            self.version = banner[1]
        elif first.first_cell().startswith(_NO_PROCESSES):
            self._process_rows(block.rows, tail)
        elif _is_data(first):
            if self.process is not None:
                self._process_rows(block.rows, tail)
            else:
                self._chip_rows(block.rows, tail)
        else:
            self._header(block.rows, tail)
            return
        self.anchor = self.anchor or first

    def _header(self, rows: list[Row], tail: bool) -> None:
        names = names_in(header_cells(rows[0]))
        if tail and not rows[-1].complete:
            return  # the input stops inside a header line
        if "Process id" in names:
            self.process = ProcessLayout.from_header(rows[0])
        elif "Health" in names:
            if len(rows) != 2:
                raise rows[-1].error(f"expected 2 header lines, found {len(rows)}")
            self.device = DeviceLayout.from_header(rows[0], rows[1])
            self.process = None
        elif "Bus-Id" in names and len(rows) == 1:
            self.device = layout_from_second_header(rows[0])
        elif not tail:
            raise rows[0].error("unrecognised line in npu-smi table")
        else:
            return
        self.anchor = self.anchor or rows[0]

    def _chip_rows(self, rows: list[Row], tail: bool) -> None:
        if tail and (len(rows) < 2 or not rows[-1].complete or self._short(rows[-1])):
            return  # cut-off tail of an excerpt
        if len(rows) == 1 and self.device is None and self.anchor is None:
            return  # an excerpt that starts inside a chip: its head is cut off
        if len(rows) != 2:
            raise rows[-1].error(f"expected 2 lines per chip, found {len(rows)}")
        if self.device is None:
            self.device = layout_from_rows(rows[0], rows[1])
        self.chips.append(self.device.chip(rows[0], rows[1]))

    def _short(self, row: Row) -> bool:
        return self.device is not None and len(row.cells) < len(self.device.row2)

    def _process_rows(self, rows: list[Row], tail: bool) -> None:
        for index, row in enumerate(rows):
            if row.first_cell().startswith(_NO_PROCESSES):
                continue
            cut = not row.complete or (
                self.process is not None and len(row.cells) < len(self.process.cells)
            )
            if tail and index == len(rows) - 1 and cut:
                return
            if self.process is None:
                raise row.error("process row before the process table header")
            self.processes.append(self.process.process(row))

    def report(self) -> NpuSmiReport:
        if self.anchor is None:
            raise ParseError("no npu-smi table found")
        if not self.chips:
            raise self.anchor.error("npu-smi table without a complete chip row")
        return NpuSmiReport(self.version, self.chips, self.processes)
