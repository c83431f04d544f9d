"""Which NUMA node (and CPUs) each accelerator is attached to, and the host's NUMA layout.

Two sources, in this order (docs/operations.md, "NUMA and CPU binding"):

1. sysfs, through the chip's PCI bus id: `/sys/bus/pci/devices/<bus id>/numa_node` (the node
   the device is attached to, -1 when the firmware gives none — Linux's
   Documentation/ABI/testing/sysfs-bus-pci) and `local_cpulist`. npu-smi prints the bus id in
   upper case (`0000:C1:00.0`); the kernel names the directory `%04x:%02x:%02x.%d`, lower
   case (drivers/pci/probe.c); nvidia-smi prints an 8-digit domain (`00000000:3B:00.0`).
2. `npu-smi info -t topo`: rows `NPU<n> <link words…> <CPU affinity>` whose last column is a
   kernel CPU list (`0-63,128-191`), as in Huawei's npu-smi reference for Ascend 950 and as
   vllm-ascend's cpu_binding.py reads it (`NPU<n>` is a logical NPU id there). A row whose last
   column is not a CPU list (the header, some devices print no affinity) gives nothing.

Standard library only; every read is of a small static file, so a probe costs a few open()s.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from workers.contracts import CPULIST_MAX_CHARS, MAX_NUMA_NODE

from .base import NpuChip

_CPU_LIST = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
_BUS_ID = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")
_TOPO_ROW = re.compile(r"NPU(\d+)\s")
_MEMTOTAL = re.compile(r"MemTotal:\s+(\d+)\s*kB")


def parse_cpulist(text: str) -> list[int]:
    """The CPUs of a kernel CPU list (`0-23,48-71` -> [0..23, 48..71]); ValueError when
    `text` is not one. An empty list is an empty string (a memory-only NUMA node)."""
    text = text.strip()
    if not text:
        return []
    if not _CPU_LIST.fullmatch(text):
        raise ValueError(f"not a CPU list: {text[:64]!r}")
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def sysfs_bus_id(bus_id: str) -> str | None:
    """The name sysfs gives the PCI device npu-smi or nvidia-smi printed, or None when
    `bus_id` is not a PCI address (`NA`, empty)."""
    match = _BUS_ID.fullmatch(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{domain[-4:]}:{bus}:{device}.{function}".lower()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def pci_numa(bus_id: str, root: str | Path = "/") -> tuple[int | None, str | None]:
    """(NUMA node, local CPU list) of the PCI device `bus_id` from sysfs; None for what the
    kernel does not know (no such device, numa_node -1, an unreadable or absurd value)."""
    name = sysfs_bus_id(bus_id)
    if name is None:
        return None, None
    device = Path(root) / "sys/bus/pci/devices" / name
    raw_node, raw_cpus = _read(device / "numa_node"), _read(device / "local_cpulist")
    node = int(raw_node) if raw_node and raw_node.isdigit() else None
    if node is not None and node > MAX_NUMA_NODE:
        node = None
    cpus = raw_cpus if raw_cpus and _CPU_LIST.fullmatch(raw_cpus) else None
    if cpus is not None and len(cpus) > CPULIST_MAX_CHARS:
        cpus = None
    return node, cpus


def parse_npu_smi_topo(text: str) -> dict[int, str]:
    """NPU index -> CPU affinity list from `npu-smi info -t topo` output. Rows start with
    `NPU<n>` and end with the affinity; the header row (it may start with `NPU0` too) and rows
    without an affinity are skipped. {} when no row has one: never raises."""
    affinity: dict[int, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        match = _TOPO_ROW.match(line)
        if match is None:
            continue
        last = line.split()[-1]
        if _CPU_LIST.fullmatch(last) and len(last) <= CPULIST_MAX_CHARS:
            affinity[int(match[1])] = last
    return affinity


def node_of_cpus(cpus: str, layout: Mapping[int, str]) -> int | None:
    """The one NUMA node of `layout` (node -> CPU list) holding every CPU of `cpus`; None
    when they span several nodes, none, or a list cannot be read (never a guess)."""
    try:
        wanted = set(parse_cpulist(cpus))
        owners = {
            node for node, listed in layout.items() if wanted & set(parse_cpulist(listed or ""))
        }
    except ValueError:
        return None
    if len(owners) != 1 or not wanted:
        return None
    (node,) = owners
    return node if wanted <= set(parse_cpulist(layout[node])) else None


def host_layout(root: str | Path = "/") -> dict[int, str]:
    """NUMA node -> CPU list of this host (`/sys/devices/system/node/node<N>/cpulist`); an
    unreadable list is "". {} on a kernel without NUMA sysfs."""
    base = Path(root) / "sys/devices/system/node"
    layout: dict[int, str] = {}
    for path in base.glob("node[0-9]*"):
        if path.name[4:].isdigit():
            layout[int(path.name[4:])] = _read(path / "cpulist") or ""
    return dict(sorted(layout.items()))


def node_memory_mb(root: str | Path = "/") -> dict[str, int]:
    """Node name ("node<N>") -> MemTotal in MB, from `/sys/devices/system/node/node<N>/meminfo`
    (`Node 0 MemTotal:  131072000 kB`, drivers/base/node.c); nodes whose file cannot be read
    are left out."""
    base = Path(root) / "sys/devices/system/node"
    memory: dict[str, int] = {}
    for path in sorted(base.glob("node[0-9]*"), key=lambda p: p.name):
        match = _MEMTOTAL.search(_read(path / "meminfo") or "")
        if match and path.name[4:].isdigit():
            memory[path.name] = int(match[1]) // 1024
    return memory


def annotate(
    chips: Iterable[NpuChip],
    *,
    root: str | Path = "/",
    topo: Mapping[int, str] | None = None,
    layout: Mapping[int, str] | None = None,
) -> list[NpuChip]:
    """Fill each chip's numa_node and cpu_affinity: from sysfs by its bus id; the CPUs else
    from the `-t topo` affinity of its logical id (its NPU id when the logical id is unknown,
    as vllm-ascend does on Ascend 950); a node sysfs does not give is the one `layout` node
    holding all those CPUs. Returns the chips still without a NUMA node."""
    missing = []
    for chip in chips:
        node, cpus = pci_numa(chip.bus_id or "", root)
        if cpus is None and topo:
            cpus = topo.get(chip.logic_id if chip.logic_id is not None else chip.npu_id)
        if node is None and cpus is not None and layout:
            node = node_of_cpus(cpus, layout)
        chip.numa_node, chip.cpu_affinity = node, cpus
        if node is None:
            missing.append(chip)
    return missing
