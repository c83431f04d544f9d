"""Data model shared by every accelerator provider.

Plain dataclasses (standard library only) so the host agent, the CLI and the console's
contract module can all use them without Django.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from workers.contracts import STATUS_TEXT_MAX_CHARS, clip

REASON_MAX_CHARS = STATUS_TEXT_MAX_CHARS - 32  # room for the provider's name

# Keys of the JSON shape printed by `python -m workers parse-npu-smi --json`.
CHIP_JSON_KEYS = (
    "npu_id",
    "chip_id",
    "name",
    "health",
    "power_w",
    "temperature_c",
    "aicore_percent",
    "memory_used_mb",
    "memory_total_mb",
    "hbm_used_mb",
    "hbm_total_mb",
    "bus_id",
)
PROCESS_JSON_KEYS = ("npu_id", "chip_id", "pid", "name", "memory_mb")


@dataclass(slots=True)
class NpuChip:
    """One accelerator chip (an Ascend die, or one GPU). None means "not reported"."""

    npu_id: int
    chip_id: int
    name: str | None = None
    health: str | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    aicore_percent: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None
    hugepages_used: int | None = None
    hugepages_total: int | None = None
    bus_id: str | None = None
    phy_id: int | None = None
    logic_id: int | None = None
    device_id: int | None = None  # the 310-family "Device" column (device logic id)
    vendor: str = "huawei"
    numa_node: int | None = None  # the NUMA node it is attached to (accelerators/numa.py)
    cpu_affinity: str | None = None  # the CPUs local to it, a kernel CPU list

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-serialisable."""
        return asdict(self)

    def to_json(self) -> dict[str, Any]:
        """Only the fields of the parse-npu-smi JSON shape, in that order."""
        return {key: getattr(self, key) for key in CHIP_JSON_KEYS}


@dataclass(slots=True)
class NpuProcess:
    """A process holding accelerator memory, as the process table lists it."""

    npu_id: int
    chip_id: int | None
    pid: int
    name: str
    memory_mb: int | None = None
    container_pid: int | None = None  # "Process id in container" (npu-smi 26.0+)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-serialisable."""
        return asdict(self)

    def to_json(self) -> dict[str, Any]:
        """Only the fields of the parse-npu-smi JSON shape, in that order."""
        return {key: getattr(self, key) for key in PROCESS_JSON_KEYS}


@dataclass(slots=True)
class NpuSmiReport:
    """What one `npu-smi info` run says: tool/driver version, chips, processes."""

    version: str | None
    npus: list[NpuChip] = field(default_factory=list)
    processes: list[NpuProcess] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The parse-npu-smi JSON shape: {"version", "npus": [...], "processes": [...]}.

        Numbers stay numbers; values npu-smi did not report are None (JSON null).
        """
        return {
            "version": self.version,
            "npus": [chip.to_json() for chip in self.npus],
            "processes": [proc.to_json() for proc in self.processes],
        }

    def to_dict(self) -> dict[str, Any]:
        """Like to_json() but with every field of every chip and process."""
        return {
            "version": self.version,
            "npus": [chip.to_dict() for chip in self.npus],
            "processes": [proc.to_dict() for proc in self.processes],
        }


class ParseError(ValueError):
    """Tool output that is there but cannot be read.

    `line_no` (1-based, counting every line of the input) and `line` name the offending
    line when there is one; str(error) is a single line.
    """

    def __init__(self, reason: str, line_no: int | None = None, line: str | None = None) -> None:
        self.reason = reason
        self.line_no = line_no
        self.line = line
        message = reason
        if line_no is not None:
            shown = (line or "").strip()
            if len(shown) > 100:
                shown = shown[:97] + "..."
            message = f"{reason} at line {line_no}: {shown!r}"
        super().__init__(message)


@dataclass(slots=True)
class ProviderResult:
    """One provider's answer. `available` False means nothing could be read;
    `reason` says why (or, with available True, what is degraded)."""

    provider: str
    available: bool
    reason: str | None = None
    chips: list[NpuChip] = field(default_factory=list)
    processes: list[NpuProcess] = field(default_factory=list)
    version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The heartbeat carries "<provider>: <reason>" as telemetry_reason, which the console
        # caps at STATUS_TEXT_MAX_CHARS: a long tool error is cut here, visibly.
        if self.reason:
            self.reason = clip(self.reason, REASON_MAX_CHARS)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-serialisable."""
        return {
            "provider": self.provider,
            "available": self.available,
            "reason": self.reason,
            "version": self.version,
            "chips": [chip.to_dict() for chip in self.chips],
            "processes": [proc.to_dict() for proc in self.processes],
            "extra": dict(self.extra),
        }


class Provider(Protocol):
    """Something that can report the accelerators of this host right now."""

    name: str

    def probe(self) -> ProviderResult:
        """Never raises for an absent or broken tool: returns available=False."""
        ...


def unavailable(provider: str, reason: str) -> ProviderResult:
    """A result saying the provider found nothing usable, and why."""
    return ProviderResult(provider=provider, available=False, reason=reason)
