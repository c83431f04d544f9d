"""CPU and memory binding of an engine to its NPUs' NUMA nodes (EngineSpec.numa_nodes).

The engine runs as `numactl --cpunodebind=N[,M] --membind=N[,M] <python -m vllm…>`: numactl
sets the CPU affinity and the memory policy and then execs the engine, so the pid the
supervisor holds is the engine's own and every process it forks (API server, engine core,
workers) inherits both. Why numactl rather than vllm-ascend's own `enable_cpu_binding` alone,
and how the two combine: docs/operations.md, "NUMA and CPU binding".

Before a start the host's real layout is checked: numactl must be installed and every node
must exist with CPUs (`/sys/devices/system/node/node<N>/cpulist`); otherwise the spec is
refused with the reason, and nothing is started.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from workers.accelerators.numa import host_layout

INSTALL_HINT = "apt-get install numactl / dnf install numactl"


def find_numactl() -> str | None:
    """The numactl executable on the agent's PATH, or None."""
    return shutil.which("numactl")


def nodes_text(nodes: Sequence[int]) -> str:
    """The node list numactl takes: `0` or `0,1`."""
    return ",".join(str(n) for n in sorted(set(nodes)))


def numa_prefix(nodes: Sequence[int], numactl: str) -> list[str]:
    """The argv prefix binding CPUs and memory to `nodes` ([] when there are none)."""
    if not nodes:
        return []
    listed = nodes_text(nodes)
    return [numactl, f"--cpunodebind={listed}", f"--membind={listed}"]


def binding_refusal(
    nodes: Sequence[int], *, numactl: str | None, root: str | Path = "/"
) -> str | None:
    """Why an engine bound to `nodes` must not start on this host, or None (also when no
    binding is asked). `numactl` is the path find_numactl() gave (None: not installed)."""
    if not nodes:
        return None
    # the host's layout first: a node it lacks is the deployment's mistake, whether or not
    # numactl is installed
    layout = host_layout(root)
    known = ",".join(str(n) for n in layout) or "none"
    for node in sorted(set(nodes)):
        if node not in layout:
            return f"NUMA node {node} does not exist on this host (its nodes: {known})"
        if not layout[node]:
            return f"NUMA node {node} has no CPUs on this host: CPU binding to it is impossible"
    if numactl is None:
        return (
            f"CPU binding to NUMA node {nodes_text(nodes)} needs numactl, which is not "
            f"installed on this host ({INSTALL_HINT}); or set the deployment's CPU binding "
            "to off"
        )
    return None
