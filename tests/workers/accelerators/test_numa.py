"""Each NPU's NUMA node and CPUs: sysfs by bus id (fake trees), `npu-smi info -t topo` (the real
Ascend 950 manual sample), and the provider that combines them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from workers.accelerators.ascend import AscendProvider
from workers.accelerators.base import NpuChip
from workers.accelerators.host import host_metrics
from workers.accelerators.numa import (
    annotate,
    host_layout,
    node_memory_mb,
    node_of_cpus,
    parse_cpulist,
    parse_npu_smi_topo,
    pci_numa,
    sysfs_bus_id,
)
from workers.contracts import CPULIST_MAX_CHARS, ChipTelemetry, Heartbeat

# The 950 manual's topology: NPU0-3 on CPUs 0-63,128-191, NPU4-7 on 64-127,192-255.
LAYOUT_950 = {0: "0-63,128-191", 1: "64-127,192-255"}


def fake_sysfs(root: Path, devices: dict[str, tuple[str, str]], nodes: dict[int, str]) -> Path:
    """A /sys with PCI devices (sysfs name -> (numa_node, local_cpulist)) and NUMA nodes."""
    for name, (node, cpus) in devices.items():
        device = root / "sys/bus/pci/devices" / name
        device.mkdir(parents=True)
        (device / "numa_node").write_text(node + "\n")
        (device / "local_cpulist").write_text(cpus + "\n")
    for node, cpus in nodes.items():
        path = root / "sys/devices/system/node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpus + "\n")
        (path / "meminfo").write_text(
            f"Node {node} MemTotal:       131072000 kB\nNode {node} MemFree:        1024 kB\n"
        )
    return root


def test_cpu_lists_are_read_as_the_kernel_prints_them():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []  # a memory-only node
    with pytest.raises(ValueError):
        parse_cpulist("0-3;8")


def test_bus_ids_map_to_the_kernels_lower_case_device_names():
    assert sysfs_bus_id("0000:C1:00.0") == "0000:c1:00.0"  # npu-smi prints upper case
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"  # nvidia-smi: 8-digit domain
    assert sysfs_bus_id("NA") is None and sysfs_bus_id("") is None


def test_sysfs_gives_the_node_and_local_cpus_or_nothing(tmp_path):
    root = fake_sysfs(
        tmp_path,
        {"0000:c1:00.0": ("1", "24-47"), "0000:01:00.0": ("-1", "0-47"), "0000:02:00.0": ("", "")},
        {},
    )
    assert pci_numa("0000:C1:00.0", root) == (1, "24-47")
    assert pci_numa("0000:01:00.0", root) == (None, "0-47")  # firmware gives no node: -1
    assert pci_numa("0000:02:00.0", root) == (None, None)
    assert pci_numa("0000:99:00.0", root) == (None, None)  # no such device


def test_topo_affinity_from_the_real_950_sample(sample):
    text = sample("npu-smi-info-t-topo-950-doc.txt")
    assert parse_npu_smi_topo(text) == {
        **dict.fromkeys(range(4), "0-63,128-191"),
        **dict.fromkeys(range(4, 8), "64-127,192-255"),
    }  # the header row (it starts with NPU0 in the first example) and the legend give nothing


def test_topo_without_an_affinity_column_gives_nothing():
    assert parse_npu_smi_topo("NPU0  X  HCCS\nNPU1  HCCS  X\n") == {}
    assert parse_npu_smi_topo("garbage") == {}


def test_affinity_maps_to_one_node_or_none():
    assert node_of_cpus("0-63,128-191", LAYOUT_950) == 0
    assert node_of_cpus("64-127,192-255", LAYOUT_950) == 1
    assert node_of_cpus("0-127", LAYOUT_950) is None  # spans both: never a guess
    assert node_of_cpus("0-31", LAYOUT_950) == 0  # part of one node
    assert node_of_cpus("300-301", LAYOUT_950) is None
    assert node_of_cpus("0-3", {}) is None


def test_host_layout_and_node_memory(tmp_path):
    root = fake_sysfs(tmp_path, {}, {0: "0-23", 1: "24-47", 10: ""})
    assert host_layout(root) == {0: "0-23", 1: "24-47", 10: ""}
    assert node_memory_mb(root) == {"node0": 128000, "node1": 128000, "node10": 128000}
    assert host_metrics(root=root)["numa_memory_mb"]["node1"] == 128000


def test_sysfs_first_then_topo_by_logical_id(tmp_path):
    root = fake_sysfs(tmp_path, {"0000:c1:00.0": ("1", "64-127,192-255")}, LAYOUT_950)
    by_sysfs = NpuChip(npu_id=0, chip_id=0, bus_id="0000:C1:00.0", logic_id=0)
    by_topo = NpuChip(npu_id=9, chip_id=0, bus_id="0000:01:00.0", logic_id=5)
    nothing = NpuChip(npu_id=7, chip_id=0, bus_id=None, logic_id=None)
    topo = {0: "0-63,128-191", 5: "64-127,192-255"}
    missing = annotate([by_sysfs, by_topo, nothing], root=root, topo=topo, layout=LAYOUT_950)
    assert (by_sysfs.numa_node, by_sysfs.cpu_affinity) == (1, "64-127,192-255")  # not topo's
    assert (by_topo.numa_node, by_topo.cpu_affinity) == (1, "64-127,192-255")
    assert missing == [nothing] and nothing.numa_node is None


def npu_smi(stand_in, tmp_path, info: str, mapping: str, topo: str | None) -> Path:
    """A stand-in npu-smi serving `info`, `info -m` and `info -t topo` (each -t topo call is
    counted in topo-calls)."""
    for name, text in (("info", info), ("map", mapping), ("topo", topo or "")):
        (tmp_path / f"{name}.txt").write_text(text)
    answer_topo = f'echo x >> "{tmp_path}/topo-calls"; '
    answer_topo += f'cat "{tmp_path}/topo.txt"' if topo is not None else "exit 2"
    return stand_in(
        "npu-smi",
        f'if [ "$2" = "-m" ]; then cat "{tmp_path}/map.txt"; exit 0; fi\n'
        f'if [ "$2" = "-t" ]; then {answer_topo}; exit 0; fi\n'
        f'cat "{tmp_path}/info.txt"',
    )


def test_provider_reads_sysfs_and_never_asks_topo_when_it_knows(stand_in, tmp_path, sample):
    info = sample("npu-smi-info-a3-ascend910-2chip-v25.2.1-partial.txt")
    root = fake_sysfs(
        tmp_path / "root",
        {
            "0000:9d:00.0": ("0", "0-39"),
            "0000:9f:00.0": ("0", "0-39"),
            "0000:99:00.0": ("1", "40-79"),
        },
        {0: "0-39", 1: "40-79"},
    )
    tool = npu_smi(stand_in, tmp_path, info, "", topo=None)
    chips = AscendProvider(str(tool), 5, map_ids=False, sysfs_root=root).probe().chips
    assert [(c.npu_id, c.chip_id, c.bus_id, c.numa_node) for c in chips] == [
        (0, 0, "0000:9D:00.0", 0), (0, 1, "0000:9F:00.0", 0), (1, 0, "0000:99:00.0", 1),
    ]  # fmt: skip
    assert not (tmp_path / "topo-calls").exists()


def test_provider_falls_back_to_topo_once(stand_in, tmp_path, sample):
    """The 950 manual's own samples: one NPU (id 0, no logical id in -m), topo affinity."""
    root = fake_sysfs(tmp_path / "root", {}, LAYOUT_950)
    tool = npu_smi(
        stand_in,
        tmp_path,
        sample("npu-smi-info-950-doc-basic.txt"),
        sample("npu-smi-info-m-950-doc.txt"),
        sample("npu-smi-info-t-topo-950-doc.txt"),
    )
    provider = AscendProvider(str(tool), 5, sysfs_root=root)
    (chip,) = provider.probe().chips
    assert (chip.logic_id, chip.numa_node, chip.cpu_affinity) == (None, 0, "0-63,128-191")
    provider.probe()
    assert (tmp_path / "topo-calls").read_text().count("x") == 1  # static: asked once


def test_provider_without_any_numa_source_reports_chips_without_a_node(stand_in, tmp_path, sample):
    tool = npu_smi(stand_in, tmp_path, sample("npu-smi-info-950-doc-basic.txt"), "", topo=None)
    result = AscendProvider(str(tool), 5, map_ids=False, sysfs_root=tmp_path / "none").probe()
    assert result.available and result.reason is None  # not a telemetry degradation
    assert result.chips[0].numa_node is None and result.chips[0].cpu_affinity is None


def test_heartbeat_carries_numa_facts_and_old_beats_stay_valid():
    chip = ChipTelemetry(npu_id=0, numa_node=1, cpu_affinity="24-47")
    assert (chip.numa_node, chip.cpu_affinity) == (1, "24-47")
    odd = ChipTelemetry(npu_id=0, numa_node=-1, cpu_affinity="rm -rf /")
    assert (odd.numa_node, odd.cpu_affinity) == (None, None)  # a bad reading, not a refusal
    with pytest.raises(ValidationError, match="cpu_affinity"):  # over the cap: refused
        ChipTelemetry(npu_id=0, cpu_affinity="0," * CPULIST_MAX_CHARS)
    old = Heartbeat.model_validate(
        {"node": "n1", "sent_at": "2026-01-01T00:00:00Z", "chips": [{"npu_id": 0}]}
    )
    assert old.chips[0].numa_node is None and old.host.numa_memory_mb == {}
