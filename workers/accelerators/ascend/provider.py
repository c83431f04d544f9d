"""AscendProvider: what `npu-smi info` reports on this host right now."""

from __future__ import annotations

from pathlib import Path

from .. import numa
from ..base import NpuChip, ParseError, ProviderResult, unavailable
from ..process import run_tool
from .mapping import NpuMapEntry, parse_npu_smi_map
from .table import parse_npu_smi_info


class AscendProvider:
    """Runs `npu-smi info` (argv list, no shell) with a time limit and parses it.

    probe() never raises for tool problems: a missing binary, a timeout (the tool is
    killed), a non-zero exit or unreadable output give available=False with a one-line
    reason. With map_ids, the logical ids of `npu-smi info -m` are added to the chips;
    that mapping is static, so it is fetched until it succeeds once and then cached. A
    failed `-m` leaves the result available, with the failure in `reason`.

    Each chip's NUMA node and local CPUs come from sysfs by its bus id; for chips sysfs says
    nothing about, `npu-smi info -t topo` is asked once per provider (the topology is static;
    an agent restart asks again) — see workers/accelerators/numa.py. A missing NUMA node is
    not a degradation: the chip is reported without one.
    """

    name = "ascend"

    def __init__(
        self,
        npu_smi: str = "npu-smi",
        timeout: float = 10.0,
        *,
        map_ids: bool = True,
        sysfs_root: str | Path = "/",
    ) -> None:
        self.npu_smi = npu_smi
        self.timeout = timeout
        self.map_ids = map_ids
        self.sysfs_root = sysfs_root
        self._map: dict[tuple[int, int], NpuMapEntry] | None = None
        self._topo: dict[int, str] | None = None  # {} once asked and nothing came of it

    def probe(self) -> ProviderResult:
        run = run_tool([self.npu_smi, "info"], self.timeout)
        failure = run.failure()
        if failure is not None:
            return unavailable(self.name, failure)
        try:
            report = parse_npu_smi_info(run.stdout)
        except ParseError as exc:
            return unavailable(self.name, f"cannot read npu-smi info output: {exc}")
        reason = self._apply_logic_ids(report.npus) if self.map_ids else None
        self._apply_numa(report.npus)
        return ProviderResult(
            provider=self.name,
            available=True,
            reason=reason,
            chips=report.npus,
            processes=report.processes,
            version=report.version,
        )

    def _apply_logic_ids(self, chips: list[NpuChip]) -> str | None:
        """Fill logic_id (and a missing phy_id) from `npu-smi info -m`; returns why not."""
        if self._map is None:
            run = run_tool([self.npu_smi, "info", "-m"], self.timeout)
            failure = run.failure()
            if failure is not None:
                return f"logical ids unknown: {failure}"
            try:
                entries = parse_npu_smi_map(run.stdout)
            except ParseError as exc:
                return f"logical ids unknown: cannot read npu-smi info -m output: {exc}"
            self._map = {(e.npu_id, e.chip_id): e for e in entries if not e.is_mcu}
        for chip in chips:
            entry = self._map.get((chip.npu_id, chip.chip_id))
            if entry is not None:
                chip.logic_id = entry.logic_id
                chip.phy_id = chip.phy_id if chip.phy_id is not None else entry.phy_id
        return None

    def _apply_numa(self, chips: list[NpuChip]) -> None:
        """Fill numa_node / cpu_affinity (sysfs, then the cached `-t topo` affinity)."""
        missing = numa.annotate(chips, root=self.sysfs_root)
        if not missing:
            return
        if self._topo is None:
            run = run_tool([self.npu_smi, "info", "-t", "topo"], self.timeout)
            self._topo = numa.parse_npu_smi_topo(run.stdout) if run.failure() is None else {}
        if self._topo:
            layout = numa.host_layout(self.sysfs_root)
            numa.annotate(missing, root=self.sysfs_root, topo=self._topo, layout=layout)
