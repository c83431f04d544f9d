"""Device-table headers of every known `npu-smi info` layout family.

Used only when the text starts below the header (a pasted excerpt): the layout is then
recognised from the shape of the first data rows, or from a lone second header line.
Each pair below is copied verbatim from a real capture (samples/README.md A.1); full
`npu-smi info` output always carries its own header, which then wins.
"""

from __future__ import annotations

from .columns import DeviceLayout, Row, header_cells

_KNOWN_HEADERS = (
    # 310, npu-smi 20.2 (no hugepages): npu-smi-info-310-atlas800-3000-v20.2.txt
    (
        "| NPU     Name      | Health          | Power(W)          Temp(C)              |",
        "| Chip    Device    | Bus-Id          | AICore(%)         Memory-Usage(MB)     |",
    ),
    # 310 / 310P / 300I Duo: npu-smi-info-310p3-single-with-proc-table-v25.3rc1.txt
    (
        "| NPU     Name                  | Health          | Power(W)     Temp(C)"
        "           Hugepages-Usage(page) |",
        "| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)"
        "                        |",
    ),
    # 910 / 910B: npu-smi-info-910b1-v24.1rc3-partial.txt
    (
        "| NPU   Name                | Health        | Power(W)    Temp(C)"
        "           Hugepages-Usage(page)|",
        "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)"
        "  HBM-Usage(MB)        |",
    ),
    # A3 (2 dies per NPU): npu-smi-info-a3-ascend910-2chip-v25.2.1-partial.txt
    (
        "| NPU   Name                | Health        | Power(W)    Temp(C)"
        "           Hugepages-Usage(page)|",
        "| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)"
        "  HBM-Usage(MB)        |",
    ),
    # Ascend 950: npu-smi-info-950-doc-basic.txt
    (
        "| NPU ID | Name             | Health        | Power(W)    Temp(C)"
        "           Hugepages-Usage(page) |",
        "|        |                  | Bus-Id        | NPU Util(%) Memory-Usage(MB)"
        "  HBM-Usage(MB)         |",
    ),
)

KNOWN_LAYOUTS = tuple(
    DeviceLayout.from_header(Row.parse(0, first), Row.parse(0, second))
    for first, second in _KNOWN_HEADERS
)


def layout_from_rows(row1: Row, row2: Row) -> DeviceLayout:
    """The known layout under which this headerless row pair reads without error."""
    for layout in KNOWN_LAYOUTS:
        try:
            layout.chip(row1, row2)
        except ValueError:
            continue
        return layout
    raise row1.error("no npu-smi header above this row and it fits no known layout")


def layout_from_second_header(row: Row) -> DeviceLayout:
    """The known layout whose second header line is `row` (its first line is missing)."""
    names = header_cells(row)
    for layout in KNOWN_LAYOUTS:
        if layout.row2 == names:
            return layout
    raise row.error("npu-smi header line without its first line fits no known layout")
