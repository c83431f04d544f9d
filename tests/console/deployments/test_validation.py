"""Every spec problem is a 422 naming the field and what is accepted."""

from __future__ import annotations

import pytest

from console.deployments.models import Deployment
from tests.factories import make_node

BASE = {
    "name": "r1-7b",
    "model_path": "/models/DeepSeek-R1-Distill-Qwen-7B",
    "served_model_name": "r1-7b",
    "tensor_parallel_size": 1,
    "npus_per_replica": 1,
    "max_model_len": 8192,
}


def post(client, **overrides):
    return client.post(
        "/api/v1/deployments", {**BASE, **overrides}, content_type="application/json"
    )


@pytest.fixture
def node(db):
    return make_node("kp-01", npus=8)


def test_a_valid_spec_is_stored_with_its_estimate(operator_client, node, fake_inspect):
    resp = post(operator_client)
    assert resp.status_code == 201, resp.content
    body = resp.json()
    assert body["block_size"] == 128  # the Ascend default is filled in
    assert body["estimate"]["fits"] and "params" in body["estimate"]["how"]
    assert body["estimate"]["weights_per_npu_mb"] == pytest.approx(
        7_615_616_512 * 2 / 2**20, rel=1e-3
    )


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        ({"block_size": "16MB"}, "block_size", "counts tokens"),
        ({"block_size": 32768}, "block_size", "128"),
        ({"tensor_parallel_size": 2}, "tensor_parallel_size", "TP x PP x DP must equal"),
        (
            {"tensor_parallel_size": 3, "npus_per_replica": 3},
            "tensor_parallel_size",
            "accepted: 1, 2, 4",
        ),
        ({"max_model_len": 65536}, "max_model_len", "16..32768"),
        ({"extra_args": ["--no-such-flag"]}, "extra_args.0", "not a flag of vllm serve"),
        ({"extra_args": ["--port", "9"]}, "extra_args.0", "placement"),
        ({"extra_args": ["; rm -rf /"]}, "extra_args.0", "follows no flag"),
        ({"extra_env": {"LD_PRELOAD": "/x.so"}}, "extra_env.LD_PRELOAD", "not allowed"),
        ({"extra_env": {"SECRET_THING": "x"}}, "extra_env.SECRET_THING", "may be passed"),
        ({"model_path": "models/x"}, "model_path", "absolute"),
        ({"model_path": "/models/../etc"}, "model_path", ".."),
        ({"gpu_memory_utilization": 0.2}, "gpu_memory_utilization", "does not fit"),
        ({"npu_ids": [0, 1]}, "npu_ids", "pinned node"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(
    operator_client, node, fake_inspect, overrides, field, words
):
    resp = post(operator_client, **overrides)
    assert resp.status_code == 422, resp.content
    body = resp.json()
    assert body["field"] == field, body
    assert words in body["message"], body
    assert not Deployment.objects.exists()


def test_known_extra_flags_pass(operator_client, node, fake_inspect):
    resp = post(
        operator_client, extra_args=["--enable-prefix-caching", "--additional-config", '{"a": 1}']
    )
    assert resp.status_code == 201, resp.content


def test_cuda_torch_on_the_host_is_refused(operator_client, node, fake_inspect):
    node.software = {"torch": "2.5.1+cu121"}
    node.save()
    resp = post(operator_client)
    assert resp.status_code == 422 and resp.json()["field"] == "device"
    assert "torch-npu" in resp.json()["message"]


def test_no_online_node_to_inspect_on(operator_client, db, fake_inspect):
    make_node("off", status="offline", npus=2)
    resp = post(operator_client)
    assert resp.status_code == 422 and resp.json()["field"] == "node_selector"


def test_duplicate_name_is_a_conflict(operator_client, node, fake_inspect):
    assert post(operator_client).status_code == 201
    assert post(operator_client).status_code == 409


def test_cpu_engines_refuse_block_size_16_as_vllm_cpu_does(operator_client, node, fake_inspect):
    resp = post(operator_client, device="cpu", block_size=16)
    assert resp.status_code == 422 and resp.json()["field"] == "block_size"
    assert "multiples of 32" in resp.json()["message"]


def test_explicit_npus_must_exist_be_healthy_and_free(operator_client, node, fake_inspect):
    from console.inventory.models import Accelerator

    Accelerator.objects.filter(node=node, npu_id=1).update(health="Alarm")
    for ids, words in (([9], "does not exist"), ([1], "is Alarm")):
        resp = post(operator_client, pinned_node="kp-01", npu_ids=ids)
        assert resp.status_code == 422 and resp.json()["field"] == "npu_ids", resp.content
        assert (
            words in resp.json()["message"] and "free healthy NPUs: [0, 2" in resp.json()["message"]
        )
    assert post(operator_client, pinned_node="kp-01", npu_ids=[3]).status_code == 201


def test_an_npu_another_deployment_pinned_is_a_conflict_naming_it(
    operator_client, node, fake_inspect
):
    assert post(operator_client, pinned_node="kp-01", npu_ids=[3]).status_code == 201
    resp = post(operator_client, name="other", pinned_node="kp-01", npu_ids=[3])
    assert resp.status_code == 409 and resp.json()["field"] == "npu_ids"
    assert "pinned by deployment" in resp.json()["message"]


def test_npu_deployments_take_only_the_block_sizes_vllm_ascend_accepts(
    operator_client, node, fake_inspect
):
    resp = post(operator_client, block_size=16)
    assert resp.status_code == 422 and resp.json()["field"] == "block_size"
    assert "32, 64, 128" in resp.json()["message"]
    assert post(operator_client, block_size=64).status_code == 201
