"""Node checks run by the agent: each says pass/fail, what it saw, and how to fix it.

Run on demand (task host.run_checks) and when the agent starts. Clock skew is measured by the
console once a report arrives, NTP-style over `host.ping` (the agent's answer carries when it
read the ping and when it answered: workers/agent.py run_command, contracts.ClockReading),
so the time a report waits in the inbox never reads as skew. The NPU network
checks (npu-network, hccn-conf) pass with "no hccn_tool" on hosts without the Ascend driver
tools, so simulated and CPU-only agents stay green; docs/operations.md, "NPU network preflight".
"""

from __future__ import annotations

import glob
import ipaddress
import os
import shutil
from pathlib import Path

from workers.accelerators import hccn
from workers.accelerators.base import NpuChip, ProviderResult
from workers.accelerators.process import run_tool
from workers.config import AgentConfig
from workers.contracts import CHECK_TEXT_MAX_CHARS, CheckResult, clip

DRIVER_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
MIN_FREE_DISK_MB = 20 * 1024
MIN_FREE_HBM_FRACTION = 0.10
CANN_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"


def check_npu_smi(result: ProviderResult, config: AgentConfig) -> CheckResult:
    if result.available:
        return CheckResult(
            name="npu-smi",
            ok=True,
            evidence=f"npu-smi {result.version or '?'} answered: {len(result.chips)} chips",
        )
    return CheckResult(
        name="npu-smi",
        ok=False,
        evidence=result.reason or "npu-smi gave nothing",
        fix=f"check `{config.npu_smi} info` by hand; in a container mount /usr/local/bin/npu-smi, "
        "/usr/local/Ascend/driver and /usr/local/dcmi; a hang means the driver is wedged: "
        "see dmesg and /var/log/npu/slog/",
    )


def check_driver_devices(root: str = "/") -> CheckResult:
    base = Path(root)
    davinci = sorted(p for p in glob.glob(str(base / "dev/davinci[0-9]*")))
    missing = [d for d in DRIVER_DEVICES if not (base / d.lstrip("/")).exists()]
    ok = bool(davinci) and not missing
    seen = f"{len(davinci)} /dev/davinciN" + (f"; missing {', '.join(missing)}" if missing else "")
    return CheckResult(
        name="driver-devices",
        ok=ok,
        evidence=seen,
        fix=""
        if ok
        else "load the NPU driver (`lsmod | grep drv_davinci`), reinstall it with the "
        "firmware from the same release, or pass --device for each in the container",
    )


def check_npu_health(result: ProviderResult) -> CheckResult:
    bad = [
        f"NPU {c.npu_id}.{c.chip_id} {c.health}" for c in result.chips if (c.health or "OK") != "OK"
    ]
    return CheckResult(
        name="npu-health",
        ok=not bad and bool(result.chips),
        evidence=", ".join(bad) if bad else f"{len(result.chips)} chips OK",
        fix=""
        if not bad
        else "read the error codes: `npu-smi info -t health -i <NPU>`; device logs "
        "under /var/log/npu/slog/; isolate the NPU in the console until it is repaired",
    )


def check_free_hbm(result: ProviderResult) -> CheckResult:
    low = []
    for c in result.chips:
        used, total = (
            (c.hbm_used_mb, c.hbm_total_mb)
            if c.hbm_total_mb
            else (c.memory_used_mb, c.memory_total_mb)
        )
        if total and used is not None and (total - used) / total < MIN_FREE_HBM_FRACTION:
            low.append(f"NPU {c.npu_id}.{c.chip_id} {used}/{total} MB")
    return CheckResult(
        name="free-hbm",
        ok=not low,
        evidence="; ".join(low) if low else "every chip has at least 10% memory free",
        fix=""
        if not low
        else "find the owner in the npu-smi process table (`npu-smi info`), stop "
        "stray processes; an engine holds ~--gpu-memory-utilization of HBM by design",
    )


def check_cann(root: str = "/") -> CheckResult:
    path = Path(root) / CANN_SET_ENV.lstrip("/")
    env_home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    ok = path.exists() or bool(env_home)
    return CheckResult(
        name="cann",
        ok=ok,
        evidence=f"{CANN_SET_ENV} {'present' if path.exists() else 'absent'}; "
        f"ASCEND_TOOLKIT_HOME={env_home or 'unset'}",
        fix=""
        if ok
        else "install the CANN toolkit matching vllm-ascend (see its compatibility "
        "matrix) and `source /usr/local/Ascend/ascend-toolkit/set_env.sh`",
    )


def check_disk(paths: tuple[str, ...]) -> CheckResult:
    low = []
    for path in paths:
        target = path if os.path.exists(path) else os.path.dirname(path) or "/"
        free_mb = shutil.disk_usage(target).free // (1024 * 1024)
        if free_mb < MIN_FREE_DISK_MB:
            low.append(f"{path}: {free_mb} MB free")
    return CheckResult(
        name="disk-space",
        ok=not low,
        evidence="; ".join(low)
        if low
        else f"≥ {MIN_FREE_DISK_MB // 1024} GB free on {', '.join(paths)}",
        fix=""
        if not low
        else "free space for engine logs and model weights (old plogs under "
        "~/ascend/log/, /var/log/npu/)",
    )


_LINK_FIX = (
    "link DOWN: check the optical module and cable (`hccn_tool -i N -optical -g`), the switch "
    "port, and the link history (`hccn_tool -i N -link_stat -g`)"
)
_HEALTH_FIX = (
    "net health is the probe of the detect address: set it (`hccn_tool -i N -netdetect -s "
    "address <gateway>`) and the gateway (`hccn_tool -i N -gateway -s gateway <ip>`), then "
    "recover the port (`hccn_tool -i N -cfg recovery`) and read `-net_health -g` again"
)
_TLS_FIX = (
    "HCCL cannot link a TLS-enabled NPU to a TLS-disabled one: make it identical everywhere, "
    "e.g. `for i in {0..7}; do hccn_tool -i $i -tls -s enable 0; done`"
)


def _is_a3(chips: list[NpuChip]) -> bool:
    # A3 (Atlas 800/900 A3) chips are named "Ascend910" by npu-smi; A2 ones "910B1".."910B4".
    return any((c.name or "").strip().lower() == "ascend910" for c in chips)


def npu_devices(chips: list[NpuChip]) -> list[int]:
    """The device ids `hccn_tool -i` takes: the chips' logical ids (npu-smi info -m) when
    known, else 0..n-1 in npu-smi's order (how Huawei's own loops count them)."""
    logic = sorted({c.logic_id for c in chips if c.logic_id is not None})
    return logic if len(logic) == len(chips) else list(range(len(chips)))


def _npu_problem(npu: hccn.NpuNetwork) -> str | None:
    seen = []
    if npu.link != "UP":
        seen.append(f"link {npu.link or npu.errors.get('-link', 'not printed')}")
    if npu.net_health != "Success":
        seen.append(f"net health {npu.net_health or npu.errors.get('-net_health', 'not printed')}")
    if npu.vnic_link not in (None, "UP"):  # A3 only: the vNIC carries HCCS traffic in a super pod
        seen.append(f"vNIC {npu.vnic_link}")
    return f"NPU {npu.device}: " + ", ".join(seen) if seen else None


def check_npu_network(
    ascend: ProviderResult,
    tool: str | None,
    *,
    runner: hccn.Runner = run_tool,
    timeout: float = hccn.TIMEOUT_S,
) -> CheckResult:
    """Every NPU's RoCE link UP and net health Success, TLS the same on all of them; the
    evidence ends with the NPU IPs and TLS state (hccn.format_facts) the console's preflight
    compares between the members of a multi-node group."""
    if tool is None:
        return CheckResult(name="npu-network", ok=True, evidence=hccn.NO_TOOL)
    devices = npu_devices(ascend.chips)
    if not devices:
        return CheckResult(
            name="npu-network",
            ok=False,
            evidence=f"{tool} is here but npu-smi listed no NPUs to ask about",
            fix="fix npu-smi first (see the npu-smi check), then run the checks again",
        )
    npus, fatal = hccn.query_network(
        tool, devices, vnic=_is_a3(ascend.chips), runner=runner, timeout=timeout
    )
    if fatal is not None:
        return CheckResult(
            name="npu-network",
            ok=False,
            evidence=fatal,
            fix=f"run `{tool} -i {devices[0]} -link -g` by hand; in a container mount "
            "/usr/local/Ascend/driver (hccn_tool is driver/tools/hccn_tool)",
        )
    bad = [p for p in map(_npu_problem, npus) if p]
    tls = hccn.tls_summary(npus)
    if tls.startswith("mixed"):
        bad.append(f"TLS differs between NPUs: {tls[len('mixed (') : -1]}")
    fixes = [
        _LINK_FIX if any(n.link != "UP" for n in npus) else "",
        _HEALTH_FIX if any(n.net_health != "Success" for n in npus) else "",
        _TLS_FIX if tls.startswith("mixed") else "",
    ]
    seen = "; ".join(bad) if bad else f"{len(npus)} NPUs: link UP, net health Success"
    return CheckResult(
        name="npu-network",
        ok=not bad,
        evidence=f"{seen}. {hccn.format_facts(npus)}",
        fix="; ".join(f for f in fixes if f),
    )


def _conf_problems(
    entries: dict[int, dict[str, str]],
) -> tuple[list[str], set[ipaddress.IPv4Network]]:
    """(problems, subnets) of the IPv4 address_N lines of an hccn.conf."""
    problems: list[str] = []
    subnets: set[ipaddress.IPv4Network] = set()
    owners: dict[str, list[int]] = {}
    for index, entry in sorted(entries.items()):
        address, netmask = entry.get("address"), entry.get("netmask")
        if not address:
            continue
        owners.setdefault(address, []).append(index)
        try:
            net = ipaddress.IPv4Interface(f"{address}/{netmask}").network
        except ValueError:
            problems.append(f"address_{index}={address} netmask_{index}={netmask} is not valid")
            continue
        subnets.add(net)
        gateway = entry.get("gateway")
        if gateway and not _inside(gateway, net):
            problems.append(f"gateway_{index}={gateway} is outside {net}")
    problems += [
        f"{address} is used by " + ", ".join(f"address_{i}" for i in idx)
        for address, idx in owners.items()
        if len(idx) > 1
    ]
    if len(subnets) > 1:
        problems.append("addresses span " + ", ".join(sorted(map(str, subnets))))
    return problems, subnets


def _inside(address: str, net: ipaddress.IPv4Network) -> bool:
    # hccn_tool itself refuses such a gateway ("The segment of configured gateway doesn't
    # match that of the configured ip adress!", driver hccn_tool/cmd.c)
    try:
        return ipaddress.IPv4Address(address) in net
    except ValueError:
        return False


def check_hccn_conf(ascend: ProviderResult, tool: str | None, root: str = "/") -> CheckResult:
    """/etc/hccn.conf (what hccn_tool writes and HCCL reads): present, one IPv4 address per
    NPU, unique, all in one subnet, each gateway inside it. One subnet is what vllm-ascend's
    A2/A3 hosts use; several planes (a 910A-era layout) are not supported by vllm-ascend."""
    path = Path(root) / hccn.HCCN_CONF.lstrip("/")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        if tool is None:
            return CheckResult(name="hccn-conf", ok=True, evidence=hccn.NO_TOOL)
        return CheckResult(
            name="hccn-conf",
            ok=False,
            evidence=f"{hccn.HCCN_CONF}: {exc.strerror or exc}",
            fix="give each NPU an IP: `hccn_tool -i N -ip -s address <ip> netmask <mask>` "
            "(it writes /etc/hccn.conf); in a container mount -v /etc/hccn.conf:/etc/hccn.conf",
        )
    entries = hccn.parse_hccn_conf(text)
    problems, subnets = _conf_problems(entries)
    present = {i for i, e in entries.items() if e.get("address")}
    # keys are indexed by the physical id (driver cfg.c "%s_%d" with phy_id)
    expected = {c.phy_id if c.phy_id is not None else d for c, d in _chips_with_ids(ascend)}
    if missing := sorted(expected - present):
        problems.append("no address_N for NPU " + ", ".join(map(str, missing)))
    if not present:
        problems.append("no address_N lines")
    subnet = f" in {next(iter(subnets))}" if len(subnets) == 1 else ""
    return CheckResult(
        name="hccn-conf",
        ok=not problems,
        evidence="; ".join(problems)
        if problems
        else f"{len(present)} addresses{subnet}, one per NPU, unique",
        fix=""
        if not problems
        else "set each NPU's address with `hccn_tool -i N -ip -s address <ip> netmask <mask>` "
        "(unique, one subnet for all NPUs of all nodes), gateways with `-gateway -s gateway`",
    )


def _chips_with_ids(ascend: ProviderResult) -> list[tuple[NpuChip, int]]:
    return list(zip(ascend.chips, npu_devices(ascend.chips), strict=True))


def run_checks(config: AgentConfig, ascend: ProviderResult, root: str = "/") -> list[CheckResult]:
    """Every check, in order. Never raises: a failing check is a result."""
    disk_paths = (str(config.state_dir), str(Path.home()))
    results = [check_npu_smi(ascend, config), check_driver_devices(root)]
    if ascend.available:
        results += [check_npu_health(ascend), check_free_hbm(ascend)]
    results += [check_cann(root), check_disk(disk_paths)]
    tool = hccn.resolve_tool(config.hccn_tool)
    results += [check_npu_network(ascend, tool), check_hccn_conf(ascend, tool, root)]
    for r in results:  # within the contract's caps: a long evidence is cut, visibly
        r.evidence = clip(r.evidence, CHECK_TEXT_MAX_CHARS)
        r.fix = clip(r.fix, CHECK_TEXT_MAX_CHARS)
    return results
