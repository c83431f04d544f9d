"""What a local model directory holds, read without torch: config.json fields, weight files,
and the parameter count from the safetensors headers.

Read-only; never loads weights (a safetensors header is 8 bytes of length + a JSON header).
Errors come back as {"ok": False, "error": ..., "field": "model_path"}, never as exceptions.

Answers are kept in memory per (directory, fingerprint): the fingerprint digests the
(inode, mtime, size) of the directory and of every file an inspection reads (config.json,
indexes, weight files, tokenizer files), so asking again about an unchanged model costs a few
stat() calls, and any changed, added, removed or replaced file is read afresh.

A readable model's answer carries the `manifest` of its files (sizes and checksums,
workers/engine/manifest.py says exactly which bytes), cached with it: what the console
compares across the hosts of a multi-host replica.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from workers.engine import manifest

_HEADER_MAX = 100 * 1024 * 1024  # a larger "header" means a corrupt or foreign file
_BYTES_PER_DTYPE = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "int8": 1,
}
_CONFIG_FIELDS = (
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",  # explicit in some configs (Qwen3); else hidden_size / heads
    "kv_lora_rank",  # MLA (DeepSeek-V2/V3/R1): the KV cache holds one latent per token
    "qk_rope_head_dim",
    # MoE sizes: with data parallel the console's estimate spreads the routed experts over
    # TP x DP NPUs (console/deployments/estimate.py); DeepSeek-V2/V3 and Qwen-MoE name them so
    "moe_intermediate_size",
    "first_k_dense_replace",
    "moe_layer_freq",
)


_CACHE_MAX = 64  # directories remembered (least recently asked about are forgotten first)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_cache: OrderedDict[Path, tuple[str, dict[str, Any]]] = OrderedDict()
_cache_lock = threading.Lock()  # commands run on several threads of the agent


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message, "field": "model_path"}


def _directory(path: str) -> Path | dict[str, Any]:
    """The resolved model directory, or an error dict."""
    if not isinstance(path, str) or not path:
        return _error("model path is empty")
    if "\0" in path:
        return _error("model path contains a NUL character")
    if not os.path.isabs(path):
        return _error(f"model path {path!r} is not absolute")
    resolved = Path(path).resolve()
    if not resolved.is_dir():
        return _error(f"model path {resolved} does not exist or is not a directory")
    return resolved


def _config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        return _error(f"model path {directory} has no config.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return _error(f"{path}: unreadable ({exc})")
    except ValueError as exc:
        return _error(f"{path}: not valid JSON ({exc})")
    if not isinstance(data, dict):
        return _error(f"{path}: not a JSON object")
    return {"ok": True, "config": data}


def _config_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The fields the console checks, looking into text_config for multimodal models."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    found: dict[str, Any] = {}
    for name in _CONFIG_FIELDS:
        found[name] = config.get(name, text.get(name))
    if found["num_key_value_heads"] is None:
        found["num_key_value_heads"] = found["num_attention_heads"]
    architectures = config.get("architectures") or []
    found["architectures"] = list(architectures) if isinstance(architectures, list) else []
    found["architecture"] = found["architectures"][0] if found["architectures"] else None
    found["torch_dtype"] = config.get("torch_dtype") or config.get("dtype") or text.get("dtype")
    found["num_experts"] = _experts(config, text)
    quant = config.get("quantization_config")
    found["quantized"] = isinstance(quant, dict)
    found["quantization"] = quant.get("quant_method") if isinstance(quant, dict) else None
    return found


# Where MoE configs name their routed experts: DeepSeek-V2/V3 (n_routed_experts), Qwen-MoE
# and Qwen3-MoE (num_experts), Mixtral (num_local_experts).
_EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts")


def _experts(config: dict[str, Any], text: dict[str, Any]) -> int:
    """Routed experts per MoE layer; 0 for a dense model."""
    for name in _EXPERT_FIELDS:
        value = config.get(name, text.get(name))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def safetensors_params(path: Path) -> int:
    """Parameters in one .safetensors file, from its header. Raises ValueError if corrupt or
    shorter than its header says (a copy cut short)."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > _HEADER_MAX:
            raise ValueError(f"header length {length} is implausible")
        raw = fh.read(length)
    if len(raw) != length:
        raise ValueError("incomplete metadata (header cut short)")
    header = json.loads(raw)
    total, end = 0, 0
    for name, tensor in header.items():
        if name != "__metadata__":
            total += math.prod(int(n) for n in tensor["shape"])
            end = max(end, int(tensor["data_offsets"][1]))
    size, expected = path.stat().st_size, 8 + length + end
    if size < expected:
        raise ValueError(f"cut short: {size} of {expected} bytes")
    return total


def _missing_from_index(directory: Path) -> list[str]:
    """Weight files an index (model.safetensors.index.json, pytorch_model.bin.index.json)
    lists that are not in the directory."""
    missing: set[str] = set()
    for index in sorted(directory.glob("*.index.json")):
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for name in set(weight_map.values()) if isinstance(weight_map, dict) else ():
            if isinstance(name, str) and not (directory / name).is_file():
                missing.add(name)
    return sorted(missing)


def _incomplete(directory: Path, weights: dict[str, Any], warnings: list[str]) -> str | None:
    """Why the weights cannot be served as they are (none, listed but missing, a shard cut
    short), or None. A half-copied model is refused here, naming what is missing."""
    if not weights["weight_files"]:
        return (
            f"model path {directory} has config.json but no weight files (*.safetensors or "
            "*.bin): is the copy finished?"
        )
    missing = _missing_from_index(directory)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        return f"model path {directory} is incomplete: its index lists missing files: {shown}"
    broken = [w for w in warnings if "cut short" in w or "incomplete metadata" in w]
    if broken:
        return f"model path {directory} has weight files cut short: {'; '.join(broken[:3])}"
    return None


def _weights(directory: Path) -> dict[str, Any]:
    files = sorted(
        p for p in directory.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin")
    )
    listed = [{"name": p.name, "bytes": p.stat().st_size} for p in files]
    return {"weight_files": listed, "weights_bytes": sum(f["bytes"] for f in listed)}


def _param_count(
    directory: Path, weights: dict[str, Any], dtype: str | None
) -> tuple[int | None, str | None, list[str]]:
    """(count, how it was found, warnings)."""
    names = [f["name"] for f in weights["weight_files"]]
    shards = [directory / n for n in names if n.endswith(".safetensors")]
    warnings: list[str] = []
    if shards:
        total = 0
        for shard in shards:
            try:
                total += safetensors_params(shard)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                warnings.append(f"{shard.name}: unreadable safetensors header ({exc})")
        if not warnings:
            return total, "safetensors headers", warnings
    if weights["weights_bytes"]:
        per = _BYTES_PER_DTYPE.get(str(dtype or "").lower(), 2)
        return weights["weights_bytes"] // per, f"file sizes / {per} bytes", warnings
    return None, None, warnings


def _read_by_inspection(name: str) -> bool:
    """config.json, the tokenizer files, indexes and weight files, and whatever else the
    manifest covers (generation config, chat template, remote code)."""
    return manifest.listed(name)


def fingerprint(directory: Path) -> tuple[str, float]:
    """(digest, newest mtime in seconds) of the directory and the files an inspection reads.

    The directory's own mtime changes when a file is added, removed or renamed in it; each
    file's (inode, mtime, size) when it is rewritten, grows or is replaced (stat() follows
    symlinks, so a hub cache's links to blobs count as the blobs)."""
    st = directory.stat()
    entries: list[tuple[str, int, int, int]] = [("", st.st_ino, st.st_mtime_ns, st.st_size)]
    with os.scandir(directory) as it:
        names = sorted(e.name for e in it if _read_by_inspection(e.name))
    for name in names:
        try:
            fs = (directory / name).stat()
        except OSError:  # a dangling link or a file removed meanwhile: its absence counts
            entries.append((name, -1, -1, -1))
            continue
        entries.append((name, fs.st_ino, fs.st_mtime_ns, fs.st_size))
    digest = hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:32]
    return digest, max(e[2] for e in entries) / 1e9


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def inspect_model(path: str) -> dict[str, Any]:
    """Describe the model at `path` (an absolute local directory). ok=True with the config
    fields, weight files, total bytes and parameter count; ok=False with `error` and
    `field: "model_path"` when the path is refused or has no readable config.json. Either
    answer about an existing directory carries its `fingerprint` and `mtime` (the newest of
    what was read, seconds since the epoch), and is cached until the fingerprint changes."""
    directory = _directory(path)
    if isinstance(directory, dict):
        return directory
    try:
        digest, mtime = fingerprint(directory)
    except OSError as exc:
        return _error(f"model path {directory}: unreadable ({exc})")
    with _cache_lock:
        hit = _cache.get(directory)
        if hit is not None and hit[0] == digest:
            _cache.move_to_end(directory)
            return copy.deepcopy(hit[1])
    # read after the fingerprint: a file changed while being read makes the next ask miss
    info = {**_inspect(directory), "fingerprint": digest, "mtime": mtime}
    with _cache_lock:
        _cache[directory] = (digest, copy.deepcopy(info))
        _cache.move_to_end(directory)
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)
    return info


def _inspect(directory: Path) -> dict[str, Any]:
    """The uncached reading of one model directory."""
    loaded = _config(directory)
    if not loaded["ok"]:
        return loaded
    fields = _config_fields(loaded["config"])
    weights = _weights(directory)
    count, source, warnings = _param_count(directory, weights, fields["torch_dtype"])
    problem = _incomplete(directory, weights, warnings)
    if problem is not None:
        return _error(problem)
    has_tokenizer = any((directory / n).is_file() for n in _TOKENIZER_FILES)
    try:
        files = manifest.build(directory)
    except OSError as exc:
        return _error(f"model path {directory}: a file cannot be read ({exc})")
    return {
        "ok": True,
        "path": str(directory),
        **fields,
        **weights,
        "param_count": count,
        "param_count_source": source,
        "has_tokenizer": has_tokenizer,
        "warnings": warnings,
        "manifest": files,
    }
