"""inspect_model on directories built here (a hand-written safetensors file, no torch)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from workers.contracts import MANIFEST_MAX_FILES, MANIFEST_SCHEME, InspectionReport, Tasks
from workers.engine import inspect, manifest
from workers.engine.inspect import inspect_model

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 2000,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}


def write_safetensors(path, tensors: dict[str, list[int]], dtype="BF16") -> None:
    """8-byte little-endian header length, the JSON header, then zero bytes for the data."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors.items():
        size = 2
        for n in shape:
            size *= n
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "qwen-tiny"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    (path / "tokenizer.json").write_text("{}")
    write_safetensors(path / "model-00001-of-00002.safetensors", {"embed": [2000, 64]})
    write_safetensors(path / "model-00002-of-00002.safetensors", {"a": [64, 128], "b": [64]})
    return path


def test_reads_config_weights_and_counts_parameters(model):
    found = inspect_model(str(model))
    assert found["ok"] and found["path"] == str(model)
    assert found["architecture"] == "Qwen2ForCausalLM" and found["model_type"] == "qwen2"
    assert (found["num_attention_heads"], found["num_key_value_heads"]) == (4, 2)
    assert found["torch_dtype"] == "bfloat16" and not found["quantized"]
    assert [f["name"] for f in found["weight_files"]] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert found["param_count"] == 2000 * 64 + 64 * 128 + 64
    assert found["param_count_source"] == "safetensors headers" and found["has_tokenizer"]
    assert found["weights_bytes"] == sum(f["bytes"] for f in found["weight_files"])


def test_defaults_kv_heads_and_notes_quantization(tmp_path):
    config = {k: v for k, v in CONFIG.items() if k != "num_key_value_heads"}
    config["quantization_config"] = {"quant_method": "awq"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\0" * 1000)
    found = inspect_model(str(tmp_path))
    assert found["num_key_value_heads"] == 4
    assert found["quantized"] and found["quantization"] == "awq"
    assert found["param_count"] == 500 and found["param_count_source"] == "file sizes / 2 bytes"


def test_a_shard_with_its_header_cut_short_is_refused_by_name(model):
    (model / "model-00002-of-00002.safetensors").write_bytes(struct.pack("<Q", 500) + b"{")
    found = inspect_model(str(model))
    assert found["ok"] is False and found["field"] == "model_path"
    assert "model-00002-of-00002.safetensors" in found["error"] and "cut short" in found["error"]


def test_a_shard_shorter_than_its_header_says_is_refused(model):
    shard = model / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])  # the copy stopped 100 bytes early
    found = inspect_model(str(model))
    assert found["ok"] is False and "model-00001-of-00002.safetensors" in found["error"]


def test_files_the_index_lists_must_exist(model):
    weight_map = {
        "embed": "model-00001-of-00003.safetensors",
        "a": "model-00002-of-00003.safetensors",
        "b": "model-00003-of-00003.safetensors",
    }
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    found = inspect_model(str(model))
    assert found["ok"] is False
    assert "model-00001-of-00003.safetensors" in found["error"] and "missing" in found["error"]


def test_config_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    found = inspect_model(str(tmp_path))
    assert found["ok"] is False and "no weight files" in found["error"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("relative/model", "is not absolute"),
        ("/tmp/x\0y", "NUL"),
        ("", "empty"),
        ("/definitely/not/here", "does not exist"),
    ],
)
def test_refused_paths(path, message):
    found = inspect_model(path)
    assert found["ok"] is False and found["field"] == "model_path" and message in found["error"]


def test_missing_or_broken_config(tmp_path):
    assert "has no config.json" in inspect_model(str(tmp_path))["error"]
    (tmp_path / "config.json").write_text("{not json")
    assert "not valid JSON" in inspect_model(str(tmp_path))["error"]


# --- the cache per (directory, fingerprint) -------------------------------------------------
@pytest.fixture
def reads(monkeypatch):
    """How many times the directory was really read (not answered from the cache)."""
    calls: list[str] = []
    real = inspect._inspect

    def counting(directory):
        calls.append(str(directory))
        return real(directory)

    monkeypatch.setattr(inspect, "_inspect", counting)
    inspect.clear_cache()
    yield calls
    inspect.clear_cache()


def test_an_unchanged_model_is_answered_from_the_cache_with_its_fingerprint(model, reads):
    first = inspect_model(str(model))
    again = inspect_model(str(model))
    assert reads == [str(model)] and again == first
    assert len(first["fingerprint"]) == 32
    newest = max(p.stat().st_mtime for p in [model, *model.iterdir()])
    assert first["mtime"] == pytest.approx(newest, abs=1e-3)
    again["weight_files"].clear()  # an answer handed out is a copy: the cache stays whole
    assert inspect_model(str(model))["weight_files"] and len(reads) == 1


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda m: (m / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 128})),
            id="config-rewritten",
        ),
        pytest.param(
            lambda m: write_safetensors(m / "model-00002-of-00002.safetensors", {"a": [64, 64]}),
            id="shard-rewritten",
        ),
        pytest.param(lambda m: (m / "model-00002-of-00002.safetensors").unlink(), id="removed"),
        pytest.param(
            lambda m: write_safetensors(m / "extra.safetensors", {"c": [8]}), id="shard-added"
        ),
        pytest.param(lambda m: os.utime(m / "config.json", ns=(1, 1)), id="same-size-other-mtime"),
    ],
)
def test_a_changed_file_is_read_again(model, reads, change):
    before = inspect_model(str(model))
    change(model)
    after = inspect_model(str(model))
    assert len(reads) == 2 and after["fingerprint"] != before["fingerprint"]


def test_a_refusal_is_cached_until_the_copy_changes(tmp_path, reads):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    assert "no weight files" in inspect_model(str(tmp_path))["error"]
    assert "no weight files" in inspect_model(str(tmp_path))["error"] and len(reads) == 1
    write_safetensors(tmp_path / "model.safetensors", {"w": [4, 4]})  # the copy finished
    assert inspect_model(str(tmp_path))["ok"] and len(reads) == 2


def test_the_agent_answers_an_inspection_on_the_inbox(model):
    """With an inspection id the answer goes to the console's inbox (the record it is for);
    without one it is only the command's return value (the reply key)."""
    from workers.agent import command_handlers

    sent: list[tuple[str, dict]] = []
    agent = SimpleNamespace(
        config=SimpleNamespace(node_name="kp-01"),
        send=lambda kind, body: sent.append((kind, body)),
        rotate=None,
    )
    handler = command_handlers(agent)[Tasks.HOST_MODEL_INSPECT]
    answer = handler(str(model), 12)
    assert sent == [
        (
            Tasks.MODEL_INSPECTION,
            {"node": "kp-01", "inspection_id": 12, "path": str(model), "result": answer},
        )
    ]
    InspectionReport.model_validate(sent[0][1])  # what the console's inbox checks
    assert handler(str(model))["ok"] and len(sent) == 1


# --- the manifest: what the console compares across a multi-host replica's members ----------
def test_the_manifest_lists_every_file_read_with_its_checksums(model):
    (model / "generation_config.json").write_text("{}")
    (model / "README.md").write_text("not compared")
    found = inspect_model(str(model))["manifest"]
    entries = {f["name"]: f for f in found["files"]}
    assert list(entries) == [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "tokenizer.json",
    ]
    assert found["scheme"] == MANIFEST_SCHEME and found["files_total"] == 5
    config = (model / "config.json").read_bytes()
    assert entries["config.json"] == {
        "name": "config.json",
        "bytes": len(config),
        "sha256": hashlib.sha256(config).hexdigest(),
    }
    raw = (model / "model-00002-of-00002.safetensors").read_bytes()
    end = 8 + struct.unpack("<Q", raw[:8])[0]
    assert entries["model-00002-of-00002.safetensors"] == {
        "name": "model-00002-of-00002.safetensors",
        "bytes": len(raw),
        "header_sha256": hashlib.sha256(raw[:end]).hexdigest(),
        "sample_sha256": hashlib.sha256(raw[end:]).hexdigest(),  # under 3 MiB: all of it
    }
    InspectionReport.model_validate(
        {"node": "kp-01", "inspection_id": 1, "path": str(model), "result": {"manifest": found}}
    )


def _flip(path, offset):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        pytest.param(
            lambda m: write_safetensors(m / "model-00002-of-00002.safetensors", {"a": [64, 64]}),
            "bytes",
            id="shard-size",
        ),
        pytest.param(  # "FP16" is as long as "BF16": the same size, another header
            lambda m: write_safetensors(
                m / "model-00002-of-00002.safetensors", {"a": [64, 128], "b": [64]}, "FP16"
            ),
            "header_sha256",
            id="shard-header",
        ),
        pytest.param(
            lambda m: _flip(m / "model-00002-of-00002.safetensors", -1),
            "sample_sha256",
            id="shard-data",
        ),
    ],
)
def test_a_changed_shard_changes_its_entry_and_the_digest(model, change, key):
    before = inspect_model(str(model))["manifest"]
    change(model)
    after = inspect_model(str(model))["manifest"]
    assert after["digest"] != before["digest"]
    old, new = before["files"][2], after["files"][2]
    assert old["name"] == new["name"] == "model-00002-of-00002.safetensors"
    assert old[key] != new[key]


def test_only_the_sampled_windows_of_a_large_shard_are_read(tmp_path):
    """The documented limit: a flipped byte outside the first, middle and last MiB of the
    data of a shard of unchanged size and header is not caught."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    shard = tmp_path / "model.safetensors"
    write_safetensors(shard, {"w": [2_200_000]})  # 4.4 MB of data
    end = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    before = inspect_model(str(tmp_path))["manifest"]
    _flip(shard, end + 1_200_000)  # past the first MiB, before the middle one
    assert inspect_model(str(tmp_path))["manifest"] == before
    _flip(shard, end + 2_200_000)  # inside the middle MiB
    assert inspect_model(str(tmp_path))["manifest"]["digest"] != before["digest"]


def test_the_manifest_is_cached_with_the_inspection(model, reads):
    first = inspect_model(str(model))["manifest"]
    assert inspect_model(str(model))["manifest"] == first and len(reads) == 1
    (model / "chat_template.jinja").write_text("{{ messages }}")  # a file it covers: read again
    again = inspect_model(str(model))["manifest"]
    assert len(reads) == 2 and "chat_template.jinja" in {f["name"] for f in again["files"]}


def test_a_manifest_past_the_cap_lists_the_first_files_and_digests_them_all(model, monkeypatch):
    monkeypatch.setattr(manifest, "MANIFEST_MAX_FILES", 2)
    before = manifest.build(model)
    assert before["files_total"] == 4 and [f["name"] for f in before["files"]] == [
        "config.json",
        "model-00001-of-00002.safetensors",
    ]
    (model / "tokenizer.json").write_text('{"a": 1}')  # past the listed two
    assert manifest.build(model)["digest"] != before["digest"]


def test_the_contract_caps_the_manifest_and_keeps_only_what_it_knows(model):
    found = inspect_model(str(model))
    report = {"node": "kp-01", "inspection_id": 1, "path": str(model)}
    extra = dict(found, manifest=dict(found["manifest"], planted="x" * 10_000))
    stored = InspectionReport.model_validate({**report, "result": extra}).result
    assert stored["manifest"] == found["manifest"]
    too_many = [found["manifest"]["files"][0]] * (MANIFEST_MAX_FILES + 1)
    with pytest.raises(ValidationError, match=f"at most {MANIFEST_MAX_FILES} items"):
        InspectionReport.model_validate(
            {**report, "result": dict(found, manifest=dict(found["manifest"], files=too_many))}
        )
    bad = dict(found["manifest"]["files"][0], sha256="not-hex")
    with pytest.raises(ValidationError, match="sha256"):
        InspectionReport.model_validate(
            {**report, "result": dict(found, manifest=dict(found["manifest"], files=[bad]))}
        )
