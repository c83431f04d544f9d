"""Cost of parsing a 16-chip `npu-smi info` output, against a bare split baseline.

The 16-chip text is built from real rows: the header and the NPU 0 block (two dies) of
the Atlas A3 capture npu-smi-info-a3-ascend910-2chip-v25.2.1-partial.txt (shipped in
workers/accelerators/samples/), repeated for NPUs 0-7 with only the NPU id and Phy-ID
cells renumbered (0-15), as on a 16-die A3 host. The baseline, timed in the same run on
the same text, is `text.splitlines()` + `str.split('|')` per line: the least any
`|`-table reader has to do.

Run: python bench/parse_npu_smi.py
"""

from __future__ import annotations

import re
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.accelerators.ascend import parse_npu_smi_info  # noqa: E402
from workers.accelerators.simulated import SAMPLES_DIR  # noqa: E402

SAMPLE = SAMPLES_DIR / "npu-smi-info-a3-ascend910-2chip-v25.2.1-partial.txt"


def _renumber(row: str, first: int, second: int | None = None) -> str:
    """Rewrite the leading numbers of a row's first cell, keeping the cell width."""
    cell = row.split("|")[1]
    numbers = [first] if second is None else [first, second]
    new = re.sub(r"\d+", lambda _: str(numbers.pop(0)) if numbers else _[0], cell, count=2)
    return row.replace(cell, new.ljust(len(cell))[: len(cell)], 1)


def sixteen_chip_text() -> str:
    lines = [line for line in SAMPLE.read_text().splitlines() if not line.startswith("#")]
    first_row = next(i for i, line in enumerate(lines) if "Ascend910" in line)
    header, block = lines[:first_row], lines[first_row : first_row + 5]  # 2 dies + separator
    out = list(header)
    for npu in range(8):
        r1a, r2a, sep, r1b, r2b = block
        out += [_renumber(r1a, npu), _renumber(r2a, 0, 2 * npu), sep]
        out += [_renumber(r1b, npu), _renumber(r2b, 1, 2 * npu + 1), lines[first_row - 1]]
    return "\n".join(out) + "\n"


def baseline(text: str) -> list[list[str]]:
    return [line.split("|") for line in text.splitlines()]


def per_call_us(func, text: str, number: int) -> float:
    return min(timeit.repeat(lambda: func(text), number=number, repeat=5)) / number * 1e6


def main() -> None:
    text = sixteen_chip_text()
    report = parse_npu_smi_info(text)
    assert [(c.npu_id, c.chip_id, c.phy_id) for c in report.npus] == [
        (n // 2, n % 2, n) for n in range(16)
    ], "16-chip text did not parse as built"
    parse_us = per_call_us(parse_npu_smi_info, text, 200)
    base_us = per_call_us(baseline, text, 2000)
    print(f"16-chip npu-smi info ({len(text.splitlines())} lines, {len(text)} bytes)")
    print(f"parse_npu_smi_info: {parse_us:8.1f} us/parse")
    print(f"baseline split:     {base_us:8.1f} us/parse")
    print(f"ratio parse/baseline: {parse_us / base_us:.1f}x")


if __name__ == "__main__":
    main()
