"""Node checks run by the agent: each says pass/fail, what it saw, and how to fix it.

Run on demand (task host.run_checks) and when the agent starts. Clock skew is judged by the
console on receipt (it compares the report's sent_at with its own clock).
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

from workers.accelerators.base import ProviderResult
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


def run_checks(config: AgentConfig, ascend: ProviderResult, root: str = "/") -> list[CheckResult]:
    """Every check, in order. Never raises: a failing check is a result."""
    disk_paths = (str(config.state_dir), str(Path.home()))
    results = [check_npu_smi(ascend, config), check_driver_devices(root)]
    if ascend.available:
        results += [check_npu_health(ascend), check_free_hbm(ascend)]
    results += [check_cann(root), check_disk(disk_paths)]
    for r in results:  # within the contract's caps: a long evidence is cut, visibly
        r.evidence = clip(r.evidence, CHECK_TEXT_MAX_CHARS)
        r.fix = clip(r.fix, CHECK_TEXT_MAX_CHARS)
    return results
