"""Ascend chip fault codes → the handling level Huawei's device plugin assigns, and what to do.

The catalogue is a verbatim copy of Ascend/ascend-device-plugin `build/faultCode.json`
(data/device-plugin-faultCode.json.txt, first line = its source). Codes there are decimal event
IDs; npu-smi (`npu-smi info -t health -i N`, "Error Code") and DCMI print them as 8 hex digits,
e.g. 80E01801. A code listed at two levels gets the more severe one, in the order the device
plugin's GetFaultTypeByCode checks them: SeparateNPU > RestartNPU > FreeRestartNPU >
RestartBusiness > RecoverRestartBusiness > NotHandleFault.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

CATALOGUE = Path(__file__).resolve().parent / "data" / "device-plugin-faultCode.json.txt"

# Most severe first (device-plugin pkg/common/fault_code.go, the version whose catalogue has
# RecoverRestartBusinessCodes, as this copy does).
LEVEL_ORDER = (
    "SeparateNPU",
    "RestartNPU",
    "FreeRestartNPU",
    "RestartBusiness",
    "RecoverRestartBusiness",
    "NotHandleFault",
)

# Meanings from Huawei's MindCluster documentation of the fault levels (不做处理, 需要重新执行
# 业务, 待芯片空闲时需复位芯片, 直接复位芯片并重新执行业务, 隔离芯片 …) and the device plugin's
# own comments ("recover and restart business", "wait free and restart NPU"), turned into the
# operator's steps on a console host.
ACTIONS = {
    "NotHandleFault": (
        "No action needed: the fault does not affect the running service. Keep watching "
        "`npu-smi info -t health -i N`."
    ),
    "RecoverRestartBusiness": (
        "The fault affects the running job and clears by itself: let the device recover, then "
        "restart the engine on the same NPU."
    ),
    "RestartRequest": (
        "Re-send the affected inference requests (for training: re-run the job); if the fault "
        "lasts more than 60 s, isolate the NPU."
    ),
    "RestartBusiness": (
        "The fault affects the running job: restart the engine on the same NPU; no chip reset "
        "is needed."
    ),
    "FreeRestartNPU": (
        "The fault affects the service: drain the NPU, and once it is idle reset the chip "
        "(`npu-smi set -t reset -i N -c C`), then restart the engine."
    ),
    "RestartNPU": (
        "Reset the chip now and re-run: stop the engine, `npu-smi set -t reset -i N -c C`, "
        "then start the engine again."
    ),
    "PreSeparateNPU": (
        "No impact yet, but schedule no new work on this NPU (isolate it after the current "
        "work ends)."
    ),
    "SeparateNPU": (
        "Isolate the NPU: stop scheduling work on it (isolate it in the console), collect the "
        "device logs (`msnpureport`, /var/log/npu/slog/) and open a hardware case."
    ),
    "SubHealthFault": (
        "Sub-health: handled per the job's subHealthyStrategy; schedule new work elsewhere."
    ),
}
UNKNOWN_ACTION = (
    "This code is not in the catalogue copy. Device-plugin releases disagree on unknown codes "
    "(older ones ignore them, newer ones isolate the NPU), so decide from "
    "`npu-smi info -t health -i N` (Error Information) and Huawei's fault-code reference."
)


def _normalise(code: str | int) -> str:
    if isinstance(code, int):
        value = code
    else:
        text = str(code).strip().lower().removeprefix("0x")
        value = int(text, 16)
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError(f"fault code out of range: {code!r}")
    return f"{value:08X}"


@cache
def catalogue() -> dict[str, str]:
    """Hex code (8 upper-case digits) → level name, most severe level kept."""
    text = CATALOGUE.read_text(encoding="utf-8")
    data = json.loads(text[text.index("{") :])
    levels: dict[str, str] = {}
    for key, codes in data.items():
        level = key.removesuffix("Codes")
        if level not in LEVEL_ORDER:
            raise ValueError(f"{CATALOGUE.name}: unknown level list {key!r}")
        for code in codes:
            hex_code = _normalise(int(code))
            current = levels.get(hex_code)
            if current is None or LEVEL_ORDER.index(level) < LEVEL_ORDER.index(current):
                levels[hex_code] = level
    return levels


def catalogue_source() -> str:
    """The catalogue copy's `# source:` line."""
    first = CATALOGUE.read_text(encoding="utf-8").splitlines()[0]
    return first.removeprefix("# source:").strip()


def fault_level(code_hex: str | int) -> dict[str, str | bool | None]:
    """`{"code", "level", "action", "known"}` for one chip fault code ("80E01801", "0x80e01801"
    or the decimal event id as an int). Unknown codes give level None and known False; a code
    that is not hexadecimal raises ValueError."""
    code = _normalise(code_hex)
    level = catalogue().get(code)
    return {
        "code": code,
        "level": level,
        "action": ACTIONS[level] if level else UNKNOWN_ACTION,
        "known": level is not None,
    }


def levels_table() -> list[dict[str, object]]:
    """One row per level in the catalogue (for the knowledge-base page)."""
    by_level: dict[str, list[str]] = {level: [] for level in LEVEL_ORDER}
    for code, level in sorted(catalogue().items()):
        by_level[level].append(code)
    return [
        {"level": level, "action": ACTIONS[level], "codes": codes}
        for level, codes in by_level.items()
    ]
