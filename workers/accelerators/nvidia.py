"""NvidiaProvider: GPUs as `nvidia-smi --query-gpu` reports them.

No real nvidia-smi capture is in shared/samples: the parser follows nvidia-smi's
documented `--format=csv,noheader,nounits` output (one comma-separated line per GPU,
fields in the order asked for, "[N/A]" / "[Not Supported]" for missing values) and is
tested on text written to that documented format only.
"""

from __future__ import annotations

import csv
import re

from .base import NpuChip, ParseError, ProviderResult, unavailable
from .process import run_tool

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "temperature.gpu",
    "power.draw",
    "utilization.gpu",
    "memory.used",
    "memory.total",
)
_MISSING = re.compile(r"\[?(N/A|Not Supported)\]?")


def _number(value: str, line_no: int, line: str, field: str) -> float | None:
    if not value or _MISSING.fullmatch(value):
        return None
    try:
        return float(value)
    except ValueError:
        raise ParseError(f"{field}: expected a number", line_no, line) from None


def _gpus(text: str) -> list[tuple[NpuChip, str]]:
    gpus = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [value.strip() for value in next(csv.reader([line]))]
        if len(fields) != len(QUERY_FIELDS):
            reason = f"expected {len(QUERY_FIELDS)} fields, found {len(fields)}"
            raise ParseError(reason, line_no, line)
        values = dict(zip(QUERY_FIELDS, fields, strict=True))
        if not values["index"].isdigit():
            raise ParseError("index: expected a whole number", line_no, line)
        number = {key: _number(values[key], line_no, line, key) for key in QUERY_FIELDS[4:]}
        used, total = number["memory.used"], number["memory.total"]
        chip = NpuChip(
            npu_id=int(values["index"]),
            chip_id=0,
            name=values["name"] or None,
            power_w=number["power.draw"],
            temperature_c=number["temperature.gpu"],
            aicore_percent=number["utilization.gpu"],
            hbm_used_mb=None if used is None else int(used),
            hbm_total_mb=None if total is None else int(total),
            bus_id=values["pci.bus_id"] or None,
            vendor="nvidia",
        )
        gpus.append((chip, values["uuid"]))
    return gpus


def parse_nvidia_csv(text: str) -> list[NpuChip]:
    """GPUs of `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`.

    Device memory goes to hbm_*; health is None (not part of this query). Raises
    ParseError for a line with another number of fields or a non-number where a number
    belongs, and when there is no line at all.
    """
    chips = [chip for chip, _ in _gpus(text)]
    if not chips:
        raise ParseError("no nvidia-smi rows found")
    return chips


class NvidiaProvider:
    """Runs nvidia-smi (argv list, time limit); never raises for tool problems."""

    name = "nvidia"

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout: float = 10.0) -> None:
        self.nvidia_smi = nvidia_smi
        self.timeout = timeout

    def probe(self) -> ProviderResult:
        argv = [
            self.nvidia_smi,
            f"--query-gpu={','.join(QUERY_FIELDS)}",
            "--format=csv,noheader,nounits",
        ]
        run = run_tool(argv, self.timeout, label="nvidia-smi")
        failure = run.failure()
        if failure is not None:
            return unavailable(self.name, failure)
        try:
            gpus = _gpus(run.stdout)
        except ParseError as exc:
            return unavailable(self.name, f"cannot read nvidia-smi output: {exc}")
        if not gpus:
            return unavailable(self.name, "nvidia-smi lists no GPU")
        return ProviderResult(
            provider=self.name,
            available=True,
            chips=[chip for chip, _ in gpus],
            extra={"uuids": {str(chip.npu_id): uuid for chip, uuid in gpus}},
        )
