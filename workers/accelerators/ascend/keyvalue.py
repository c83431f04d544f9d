"""Parsers for `npu-smi info -t <type> -i N [-c C]` key/value output.

npu-smi prints these as `"\\t%-30s : %s\\n"` (ECC: width 40). Chips are blank-line
separated paragraphs: in `-t common` the `Chip ID` line opens its paragraph, in
`-t usages` and `-t ecc` it closes it; an MCU paragraph starts with `Chip Name : mcu`.
A leading `NPU ID` / `Chip Count` paragraph applies to the chips that follow it.
`-t proc-mem` lines (`Process id:395864  Process name:...`) are not key/value lines and
are not read here.
"""

from __future__ import annotations

import re
from typing import Any

from ..base import ParseError

# "%-30s : %s": key (no ':'), space, ':', then a space or the end of the line. The key is
# empty on continuation lines. Rejects URLs, timestamps, "Example 1:" and "Process id:123".
_KEY_VALUE = re.compile(r"(?:(?P<key>[^:]*?)\s+)?:(?:\s+(?P<value>.*?))?\s*")
_CONTEXT_KEYS = frozenset({"NPU ID", "Chip Count"})
_MISSING = frozenset({"NA", "-", ""})

Record = dict[str, str]


def _paragraphs(text: str) -> list[Record]:
    paragraphs: list[Record] = []
    current: Record = {}
    last_key: str | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        match = _KEY_VALUE.fullmatch(line) if not line.startswith("#") else None
        if not line:
            if current:
                paragraphs.append(current)
            current, last_key = {}, None
        elif match is None:
            continue  # a pasted command line or comment, not output
        else:
            key, value = match["key"] or "", match["value"] or ""
            if not key and last_key is not None:
                current[last_key] += "\n" + value  # continuation line
            elif key in current:
                raise ParseError(f"{key!r} repeated in one block", line_no, raw)
            else:
                current[key] = value
                last_key = key
    if current:
        paragraphs.append(current)
    return paragraphs


def parse_key_values(text: str) -> list[Record]:
    """One dict per chip (or per block) of `key : value` output, values as printed.

    Guarantees: a leading NPU ID/Chip Count block is merged into each following block
    (not returned on its own unless it is all there is); continuation lines (empty key)
    are appended to the previous value with a newline. Raises ParseError when no
    key/value line is found or a key repeats inside one block.
    """
    paragraphs = _paragraphs(text)
    if not paragraphs:
        raise ParseError("no 'key : value' lines found")
    records: list[Record] = []
    context: Record = {}
    for index, paragraph in enumerate(paragraphs):
        following = paragraphs[index + 1] if index + 1 < len(paragraphs) else None
        if set(paragraph) <= _CONTEXT_KEYS and following and "NPU ID" not in following:
            context = paragraph
        else:
            records.append({**context, **paragraph})
    return records


def _number(record: Record, key: str) -> float | None:
    value = record.get(key)
    if value is None or value in _MISSING:
        return None
    try:
        return float(value)
    except ValueError:
        raise ParseError(f"{key}: expected a number, got {value!r}") from None


def _int(record: Record, key: str) -> int | None:
    value = _number(record, key)
    return None if value is None else int(value)


def _text(record: Record, key: str) -> str | None:
    value = record.get(key)
    return None if value is None or value in _MISSING else value


def parse_health(text: str) -> list[dict[str, Any]]:
    """`-t health` output: health word, error codes (hex strings), error descriptions.

    Reads both `Health Status` (A2/A3/310P) and `Health` (Ascend 950 manual).
    """
    results = []
    for record in parse_key_values(text):
        health = _text(record, "Health Status") or _text(record, "Health")
        if health is None:
            raise ParseError("no 'Health Status' line in npu-smi health output")
        info = _text(record, "Error Information")
        results.append(
            {
                "npu_id": _int(record, "NPU ID"),
                "chip_id": _int(record, "Chip ID"),
                "health": health,
                "error_codes": (_text(record, "Error Code") or "").split(),
                "error_info": [line for line in (info or "").splitlines() if line],
            }
        )
    return results


_BOARD_TEXT = {
    "chip_type": "Chip Type",
    "chip_name": "Chip Name",
    "chip_version": "Chip Version",
    "npu_name": "NPU Name",
    "product_name": "Product Name",
    "serial_number": "Serial Number",
    "bus_id": "PCIe Bus Info",
    "board_id": "Board ID",
    "firmware_version": "Firmware Version",
    "software_version": "Software Version",
}


def parse_board(text: str) -> list[dict[str, Any]]:
    """`-t board [-c C]` output: identity fields (None when absent or NA) plus `raw`."""
    results = []
    for record in parse_key_values(text):
        board: dict[str, Any] = {
            "npu_id": _int(record, "NPU ID"),
            "chip_id": _int(record, "Chip ID"),
            "chip_count": _int(record, "Chip Count"),
        }
        board.update({name: _text(record, key) for name, key in _BOARD_TEXT.items()})
        board["raw"] = record
        results.append(board)
    return results


_USAGE_NUMBERS = {
    "ddr_capacity_mb": "DDR Capacity(MB)",
    "ddr_usage_percent": "DDR Usage Rate(%)",
    "hugepages_total": "DDR Hugepages Total(page)",
    "hugepages_usage_percent": "DDR Hugepages Usage Rate(%)",
    "hbm_capacity_mb": "HBM Capacity(MB)",
    "hbm_usage_percent": "HBM Usage Rate(%)",
    "aicore_percent": "Aicore Usage Rate(%)",
    "aicpu_percent": "Aicpu Usage Rate(%)",
    "ctrlcpu_percent": "Ctrlcpu Usage Rate(%)",
    "vectorcore_percent": "Vectorcore Usage Rate(%)",
    "ddr_bandwidth_percent": "DDR Bandwidth Usage Rate(%)",
    "hbm_bandwidth_percent": "HBM Bandwidth Usage Rate(%)",
}


def parse_usages(text: str) -> list[dict[str, Any]]:
    """`-t usages` output, one dict per chip: numbers (None when absent) plus `raw`."""
    results = []
    for record in parse_key_values(text):
        usage: dict[str, Any] = {
            "npu_id": _int(record, "NPU ID"),
            "chip_id": _int(record, "Chip ID"),
        }
        usage.update({name: _number(record, key) for name, key in _USAGE_NUMBERS.items()})
        usage["raw"] = record
        results.append(usage)
    return results
