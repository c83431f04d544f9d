"""Host metrics for the heartbeat: CPU, memory, disks, NUMA, OS. Fast (no sleeping).

Kunpeng hosts are aarch64: the CPU model comes from /proc/cpuinfo "model name" on x86
and from "CPU implementer"/"CPU part" on ARM, never assuming x86.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from workers.contracts import (
    IFNAME_MAX_CHARS,
    IP_MAX_CHARS,
    MAX_INTERFACE_ADDRESSES,
    MAX_INTERFACES,
    MAX_LISTENING_PORTS,
    STATUS_TEXT_MAX_CHARS,
    clip,
)

from .numa import node_memory_mb

# (CPU implementer, CPU part) of /proc/cpuinfo on ARM -> marketing name.
ARM_CPUS = {("0x48", "0xd01"): "Kunpeng 920 (HiSilicon TSV110)"}
_MB = 1024 * 1024


def _cpuinfo_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def cpu_model(root: str | Path = "/") -> str | None:
    """CPU model name from /proc/cpuinfo; platform.processor() when it says nothing."""
    try:
        text = (Path(root) / "proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    fields = _cpuinfo_fields(text)
    if fields.get("model name"):
        return fields["model name"]
    implementer = fields.get("CPU implementer", "").lower()
    part = fields.get("CPU part", "").lower()
    if implementer and part:
        return ARM_CPUS.get((implementer, part), f"ARM implementer {implementer} part {part}")
    return platform.processor() or None


def os_name(root: str | Path = "/") -> str | None:
    """PRETTY_NAME of /etc/os-release (or /usr/lib/os-release); None if neither."""
    for relative in ("etc/os-release", "usr/lib/os-release"):
        try:
            text = (Path(root) / relative).read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip("\"'") or None
    return None


def numa_nodes(root: str | Path = "/") -> dict[str, str]:
    """NUMA node name -> cpu list as the kernel prints it ({"node0": "0-23"})."""
    base = Path(root) / "sys/devices/system/node"
    nodes = {}
    for path in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            nodes[path.name] = (path / "cpulist").read_text().strip()
        except OSError:
            nodes[path.name] = ""
    return nodes


def disk_usage(paths: Iterable[str]) -> dict[str, dict[str, Any]]:
    """total/used/free MB per path; {"error": ...} for a path that cannot be read."""
    disks: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            usage = psutil.disk_usage(path)
        except OSError as exc:
            disks[path] = {"error": clip(exc.strerror or str(exc), STATUS_TEXT_MAX_CHARS)}
            continue
        disks[path] = {
            "total_mb": usage.total // _MB,
            "used_mb": usage.used // _MB,
            "free_mb": usage.free // _MB,
        }
    return disks


def host_metrics(paths: Iterable[str] = ("/",), root: str | Path = "/") -> dict[str, Any]:
    """A snapshot of this host. Returns without blocking: cpu_percent is measured
    since the previous call in this process (psutil interval=None; 0.0 the first time).
    Memory "used" is total minus available. Free text is clipped to the caps of
    workers.contracts.HostInfo (the Node columns it fills), so the console never refuses it."""
    memory = psutil.virtual_memory()
    numa = numa_nodes(root)
    model, os_pretty = cpu_model(root), os_name(root)
    return {
        "hostname": socket.gethostname(),
        "arch": clip(platform.machine(), 32),
        "cpu_model": clip(model, 200) if model else model,
        "cpu_cores": {
            "logical": psutil.cpu_count(logical=True),
            "physical": psutil.cpu_count(logical=False),
        },
        "cpu_percent": psutil.cpu_percent(interval=None),
        "load_avg": list(os.getloadavg()),
        "memory_total_mb": memory.total // _MB,
        "memory_used_mb": (memory.total - memory.available) // _MB,
        "disks": disk_usage(paths),
        "numa_node_count": len(numa),
        "numa_cpulists": numa,
        "numa_memory_mb": node_memory_mb(root),
        "os": clip(os_pretty, 200) if os_pretty else os_pretty,
        "kernel": clip(platform.release(), 100),
        "listening_ports": listening_ports(),
        "interfaces": interfaces(),
    }


def listening_ports() -> list[int]:
    """TCP ports (1024-65535) something on this host listens on, sorted, at most
    MAX_LISTENING_PORTS: the console places engines on none of them. [] when the system does
    not let this process see them."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return []
    ports = {
        c.laddr.port
        for c in conns
        if c.status == psutil.CONN_LISTEN and c.laddr and 1024 <= c.laddr.port <= 65535
    }
    return sorted(ports)[:MAX_LISTENING_PORTS]


def interfaces(found: Mapping[str, list[Any]] | None = None) -> dict[str, list[str]]:
    """Interface name -> its IPv4 and IPv6 addresses (psutil.net_if_addrs(), or `found` in
    its shape), within workers.contracts.HostInfo's caps: at most MAX_INTERFACES interfaces
    (by name order, those with an address) of at most MAX_INTERFACE_ADDRESSES addresses each;
    a name longer than the kernel allows, or an address too long to be one, is left out. {}
    when the system does not say. The console picks a group member's GLOO/TP/HCCL_SOCKET_IFNAME from it."""
    if found is None:
        try:
            found = psutil.net_if_addrs()
        except OSError:
            return {}
    families = (socket.AF_INET, socket.AF_INET6)
    result: dict[str, list[str]] = {}
    for name in sorted(found):
        if len(result) >= MAX_INTERFACES:
            break
        if not 0 < len(name) <= IFNAME_MAX_CHARS:
            continue
        addresses = [
            a.address
            for a in found[name]
            if a.family in families and a.address and len(a.address) <= IP_MAX_CHARS
        ]
        if addresses:  # an interface without an address carries no group traffic
            result[name] = list(dict.fromkeys(addresses))[:MAX_INTERFACE_ADDRESSES]
    return result
