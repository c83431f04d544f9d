"""Huawei Ascend provider: parsers for `npu-smi` output and the probe that runs it."""

from .keyvalue import parse_board, parse_health, parse_key_values, parse_usages
from .mapping import NpuMapEntry, parse_npu_smi_map
from .provider import AscendProvider
from .table import parse_npu_smi_info

__all__ = [
    "AscendProvider",
    "NpuMapEntry",
    "parse_board",
    "parse_health",
    "parse_key_values",
    "parse_npu_smi_info",
    "parse_npu_smi_map",
    "parse_usages",
]
