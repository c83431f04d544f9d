"""Benchmark fixtures: a deployment whose one ready replica is a local fake OpenAI server."""

from __future__ import annotations

import pytest

from console.deployments.models import Deployment, Replica
from tests.console.benchmarks.fake_openai import FakeEngine
from tests.factories import make_node


@pytest.fixture
def fake_engine():
    with FakeEngine(ttft_s=0.05, itl_s=0.01) as engine:
        yield engine


def make_deployment(name: str = "tiny", *, port: int | None, ready: bool = True, **spec):
    fields = {
        "model_path": "/models/tiny",
        "served_model_name": "tiny",
        "device": "cpu",
        "max_model_len": 256,
        "max_num_seqs": 4,
        "replicas": 1,
        "desired_state": "running",
    }
    fields.update(spec)
    dep = Deployment.objects.create(name=name, **fields)
    if port is not None:
        node = make_node(f"{name}-node")
        Replica.objects.create(
            deployment=dep, index=0, node=node, port=port, state="ready" if ready else "loading"
        )
    return dep


@pytest.fixture
def deployment(db, fake_engine):
    return make_deployment(port=fake_engine.port)
