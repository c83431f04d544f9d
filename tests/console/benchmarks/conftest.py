"""Benchmark fixtures: a deployment whose one ready replica is the kit's fake engine (the
`fake_engine` fixture of tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.kit import make_deployment

# What the benchmark tests deploy: a small CPU engine (max_model_len bounds the run's tokens).
BENCH = {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "desired_state": "running"}


@pytest.fixture
def deployment(db, fake_engine):
    return make_deployment("tiny", ports=[fake_engine.port], **BENCH)
