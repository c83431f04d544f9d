"""A replica across hosts: each member's flags and environment against the recipe vllm-ascend
documents for DeepSeek-V3 W8A8 on two Atlas 800 A2 (docs/source/tutorials/multi_node.md,
vllm-project/vllm-ascend @15d5288: node0 and node1, DP 4, DP local 2, TP 4, expert
parallel, RPC port 13389)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from workers.engine.group import GROUP_FLAGS, GroupSpec, group_argv, group_env, interface_of
from workers.engine_settings import settings_argv

NODE0, NODE1 = "10.0.0.1", "10.0.0.2"
SETTINGS = {
    "tensor_parallel_size": 4,
    "pipeline_parallel_size": 1,
    "data_parallel_size": 4,
    "enable_expert_parallel": True,
    "dtype": "auto",
    "quantization": "ascend",
    "max_model_len": 32768,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 4096,
    "gpu_memory_utilization": 0.9,
    "block_size": None,
    "enforce_eager": False,
    "trust_remote_code": True,
}
# The documented flags that concern the layout (the rest — seed, served name, additional
# config — are a deployment's own settings or extra args).
DOC_NODE0 = {
    ("--data-parallel-size", "4"),
    ("--data-parallel-size-local", "2"),
    ("--data-parallel-address", NODE0),
    ("--data-parallel-rpc-port", "13389"),
    ("--tensor-parallel-size", "4"),
    ("--enable-expert-parallel", None),
}
DOC_NODE1 = DOC_NODE0 | {("--headless", None), ("--data-parallel-start-rank", "2")}


def member(rank: int, local: str, **overrides) -> GroupSpec:
    return GroupSpec(
        rank=rank,
        size=2,
        data_parallel_size=4,
        leader_address=NODE0,
        rpc_port=13389,
        local_address=local,
        interface="enp189s0f0",
        **overrides,
    )


def pairs(argv: list[str]) -> set[tuple[str, str | None]]:
    out, i = set(), 0
    while i < len(argv):
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
        out.add((argv[i], value))
        i += 2 if value is not None else 1
    return out


@pytest.mark.parametrize(
    ("rank", "local", "documented"), [(0, NODE0, DOC_NODE0), (1, NODE1, DOC_NODE1)]
)
def test_each_member_gets_the_documented_layout_flags(rank, local, documented):
    argv = settings_argv(SETTINGS) + group_argv(member(rank, local))
    layout = {p for p in pairs(argv) if p[0] in {f for f, _ in DOC_NODE1}}
    assert layout == documented


def test_each_member_sets_its_own_address_and_interface():
    env = group_env(member(1, NODE1))
    assert env["HCCL_IF_IP"] == NODE1
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "enp189s0f0"
    assert env["HCCL_SOCKET_IFNAME"] == "enp189s0f0"
    assert (env["HCCL_INTRA_PCIE_ENABLE"], env["HCCL_INTRA_ROCE_ENABLE"]) == ("1", "0")
    a3 = group_env(member(1, NODE1, fabric="a3"))
    assert "HCCL_INTRA_PCIE_ENABLE" not in a3 and a3["HCCL_IF_IP"] == NODE1


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"rank": 2}, "rank 2 of a 2-host group"),
        ({"data_parallel_size": 3}, "does not split"),
        ({"leader_address": "node0.example"}, "IP"),
        ({"local_address": "0.0.0.0"}, "not a host address"),
        ({"interface": "eth0; reboot"}, "interface"),
        ({"interface": "--foo=bar"}, "interface"),
    ],
)
def test_a_group_spec_built_from_bad_facts_is_refused(fields, words):
    values = {
        "rank": 1,
        "size": 2,
        "data_parallel_size": 4,
        "leader_address": NODE0,
        "rpc_port": 13389,
        "local_address": NODE1,
        "interface": "eth0",
    } | fields
    with pytest.raises(ValidationError, match=words):
        GroupSpec(**values)


def test_the_interface_is_found_from_the_reported_addresses():
    reported = {"lo": ["127.0.0.1", "::1"], "enp189s0f0": ["10.0.0.2/24", "fe80::1%enp189s0f0"]}
    assert interface_of(NODE1, reported) == "enp189s0f0"
    assert interface_of("127.0.0.1", reported) == "lo"
    assert interface_of("10.9.9.9", reported) is None


def test_group_flags_cover_what_the_builder_emits():
    for rank, local in ((0, NODE0), (1, NODE1)):
        for flag, _ in pairs(group_argv(member(rank, local))):
            assert flag in GROUP_FLAGS
