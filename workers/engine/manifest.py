"""A manifest of a model directory: what the console compares across the hosts of a
multi-host replica before it starts one (console/deployments/groups.py, check_weights).

Exactly what is recorded, per file, in name order (scheme `MANIFEST_SCHEME`):

- config.json, generation_config.json, the tokenizer and chat-template files, every
  `*.index.json` and `*.py` (remote code): size + SHA-256 of the whole file (`sha256`);
- every `*.safetensors`: size, SHA-256 of its header — the 8-byte length and the JSON that
  names every tensor with its dtype, shape and byte offsets (`header_sha256`) — and SHA-256 of
  three 1 MiB windows of its tensor data: the first MiB, the MiB in the middle and the last
  MiB, or all of it when it is 3 MiB or less (`sample_sha256`);
- every `*.bin` (a pickled torch file, no header to read): size + SHA-256 of the same three
  windows of the whole file (`sample_sha256`).

Not caught: a weight file of the same size and header whose bytes differ only outside those
windows — a bit flip in the middle of a shard. Hashing 600+ GB of weights in full would take
many minutes per host (ten at 1 GB/s); this reads about 3 MiB per weight file (half a GiB for
DeepSeek-V3's 163 shards), once per state of the directory (inspect.py caches it with the
inspection, by the same fingerprint).

`digest` is the SHA-256 of every entry; the list itself is capped at MANIFEST_MAX_FILES
entries (the contract's cap), with `files_total` saying how many there were.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

from workers.contracts import MANIFEST_MAX_FILES, MANIFEST_SCHEME

WINDOW = 1024 * 1024  # bytes per sample window
HEADER_MAX = 100 * 1024 * 1024  # = inspect._HEADER_MAX: a larger "header" is not one
WEIGHT_SUFFIXES = (".safetensors", ".bin")
WHOLE_SUFFIXES = (".index.json", ".py")
WHOLE_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "chat_template.jinja",
        "chat_template.json",
    }
)


def listed(name: str) -> bool:
    """Whether a file of this name is in the manifest (and so in the inspection's
    fingerprint: a change to it is read afresh)."""
    return name in WHOLE_FILES or name.endswith(WHOLE_SUFFIXES + WEIGHT_SUFFIXES)


def build(directory: Path) -> dict[str, Any]:
    """The manifest of `directory` (its top level: a model directory is flat). Raises
    OSError when a listed file cannot be read."""
    with os.scandir(directory) as it:
        names = sorted(e.name for e in it if listed(e.name) and e.is_file())
    entries = [file_entry(directory / name) for name in names]
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    return {
        "scheme": MANIFEST_SCHEME,
        "digest": hashlib.sha256(canonical).hexdigest(),
        "files_total": len(entries),
        "files": entries[:MANIFEST_MAX_FILES],
    }


def file_entry(path: Path) -> dict[str, Any]:
    """{name, bytes} and the checksums this kind of file gets (see the module docstring)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        entry: dict[str, Any] = {"name": path.name, "bytes": size}
        if path.name.endswith(".safetensors"):
            end = _header_end(fh, size)
            fh.seek(0)
            entry["header_sha256"] = hashlib.sha256(fh.read(end)).hexdigest()
            entry["sample_sha256"] = _windows(fh, end, size)
        elif path.name.endswith(".bin"):
            entry["sample_sha256"] = _windows(fh, 0, size)
        else:
            entry["sha256"] = hashlib.file_digest(fh, "sha256").hexdigest()
    return entry


def _header_end(fh: BinaryIO, size: int) -> int:
    """Where a safetensors header ends (8 + its length); 8 (or less) for a file whose length
    field is implausible: then only those bytes count as its header."""
    head = fh.read(8)
    if len(head) < 8:
        return len(head)
    (length,) = struct.unpack("<Q", head)
    return 8 + length if length <= HEADER_MAX and 8 + length <= size else 8


def _windows(fh: BinaryIO, start: int, end: int) -> str:
    """SHA-256 of the first, middle and last WINDOW of [start, end), or of all of it when it
    is 3 windows or less."""
    span = end - start
    if span <= 3 * WINDOW:
        spans = [(start, span)]
    else:
        spans = [(start, WINDOW), (start + (span - WINDOW) // 2, WINDOW), (end - WINDOW, WINDOW)]
    digest = hashlib.sha256()
    for offset, length in spans:
        fh.seek(offset)
        digest.update(fh.read(length))
    return digest.hexdigest()
