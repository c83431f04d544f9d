"""Deployment fixtures: a fake model inspection (the real one is a host task, tested end to end)."""

from __future__ import annotations

import pytest

QWEN_7B_LIKE = {
    "ok": True,
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "param_count": 7_615_616_512,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "hidden_size": 3584,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "weights_bytes": 15_231_233_024,
}


@pytest.fixture
def fake_inspect(monkeypatch):
    """Model inspection answered in-process with a Qwen2-7B-like config (what the agent reads)."""
    info = dict(QWEN_7B_LIKE)

    def inspect(node, path, timeout=20.0):
        return dict(info, path=path)

    monkeypatch.setattr("console.deployments.services.inspect_model", inspect)
    return info
