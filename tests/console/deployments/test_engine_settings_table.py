"""The console's side of the one table: columns, API, form, detail page and the extra_args
guard all derive from workers/engine_settings.py; create is one service call per intent."""

from __future__ import annotations

import pytest

from console.accounts.models import AuditEntry
from console.deployments.models import Deployment
from console.deployments.schemas import DeploymentIn, DeploymentOut
from console.deployments.validation import MANAGED_FLAGS, known_flags
from tests.factories import make_node
from workers import engine_settings as es

BASE = {
    "name": "r1-7b",
    "model_path": "/models/DeepSeek-R1-Distill-Qwen-7B",
    "served_model_name": "r1-7b",
    "max_model_len": 8192,
}


def test_every_row_is_a_real_vllm_flag():
    """vllm_serve_flags.txt is read from the engine's own parser: a typo in the table fails.
    A row without a flag is the agent's own (allocator: LD_PRELOAD), never passed to vLLM."""
    for row in es.ROWS:
        assert row.flag in known_flags() or (row.flag == "" and row.name == "allocator"), row
    assert "" not in es.settings_argv({r.name: r.default for r in es.ROWS})


def test_every_row_is_a_column_with_the_tables_default_and_help():
    for row in es.ROWS:
        column = Deployment._meta.get_field(row.name)
        assert column.null == row.optional and column.help_text == row.help, row.name
        if row.default is not None:
            assert column.default == row.default, row.name


def test_the_api_shapes_and_the_guard_take_every_row():
    for row in es.ROWS:
        assert row.name in DeploymentIn.model_fields and row.name in DeploymentOut.model_fields
        assert not row.flag or MANAGED_FLAGS[row.flag] == row.name


def test_openapi_names_each_settings_vllm_flag(admin_client):
    schema = admin_client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    props = schema["DeploymentIn"]["properties"]
    for row in es.ROWS:
        assert props[row.name]["x-vllm-flag"] == row.flag


def test_the_form_renders_every_form_row_with_its_range(operator_client, db):
    body = operator_client.get("/deployments/new").content.decode()
    for row in es.rows(es.FORM):
        assert f'name="{row.name}"' in body and row.flag in body, row.name
        if row.le is not None and row.kind is not bool:
            assert f'max="{row.le:g}"' in body or f'max="{row.le}"' in body, row.name


@pytest.fixture
def node(db):
    return make_node("kp-01", npus=8)


def test_create_running_is_one_call_one_audit_entry_with_the_spec(
    operator_client, node, fake_inspect, monkeypatch
):
    kicked = []
    monkeypatch.setattr("console.deployments.services._kick_reconcile", lambda: kicked.append(1))
    resp = operator_client.post(
        "/api/v1/deployments",
        {**BASE, "desired_state": "running", "extra_env": {"HF_TOKEN_X": "s3cret"}},
        content_type="application/json",
    )
    assert resp.status_code == 201, resp.content
    entries = list(AuditEntry.objects.filter(action__startswith="deployment."))
    assert [e.action for e in entries] == ["deployment.create"] and kicked == [1]
    spec = entries[0].after["spec"]
    assert spec["max_model_len"] == 8192 and spec["block_size"] == 128
    assert spec["extra_env"] == {"HF_TOKEN_X": "***"}  # the audit never holds a secret
    assert Deployment.objects.get().desired_state == "running"


def test_update_keeps_the_desired_state_unless_it_is_named(operator_client, node, fake_inspect):
    url = "/api/v1/deployments/r1-7b"
    assert (
        operator_client.post(
            "/api/v1/deployments",
            {**BASE, "desired_state": "running"},
            content_type="application/json",
        ).status_code
        == 201
    )
    resp = operator_client.put(
        url, {**BASE, "max_model_len": 4096}, content_type="application/json"
    )
    assert resp.status_code == 200 and resp.json()["desired_state"] == "running"
    assert resp.json()["max_model_len"] == 4096
    resp = operator_client.put(
        url, {**BASE, "desired_state": "stopped"}, content_type="application/json"
    )
    assert resp.json()["desired_state"] == "stopped"
    update = AuditEntry.objects.filter(action="deployment.update").order_by("pk").first()
    assert update.before["spec"]["max_model_len"] == 8192
    assert update.after["spec"]["max_model_len"] == 4096
    renamed = operator_client.put(url, {**BASE, "name": "other"}, content_type="application/json")
    assert renamed.status_code == 422 and renamed.json()["field"] == "name"


def test_the_detail_page_shows_the_derived_flags(operator_client, node, fake_inspect):
    operator_client.post(
        "/api/v1/deployments", {**BASE, "enforce_eager": True}, content_type="application/json"
    )
    body = operator_client.get("/deployments/r1-7b/").content.decode()
    assert "--max-model-len 8192" in body and "--enforce-eager" in body
    assert "--block-size 128" in body


def test_a_groups_own_flags_are_refused_in_extra_args(operator_client, node, fake_inspect):
    """--headless, --data-parallel-address… are set by the console for a multi-host replica
    (workers/engine/group.py), never typed."""
    for flag in ("--headless", "--data-parallel-address=10.0.0.9", "--master-port"):
        resp = operator_client.post(
            "/api/v1/deployments", {**BASE, "extra_args": [flag]}, content_type="application/json"
        )
        assert resp.status_code == 422 and "placement" in resp.json()["message"], flag


def test_expert_parallel_needs_a_model_with_experts(operator_client, node, fake_inspect):
    fake_inspect["num_experts"] = 0  # the Qwen2-7B-like model is dense
    resp = operator_client.post(
        "/api/v1/deployments",
        {**BASE, "enable_expert_parallel": True},
        content_type="application/json",
    )
    assert resp.status_code == 422 and resp.json()["field"] == "enable_expert_parallel"
    fake_inspect["num_experts"] = 64
    resp = operator_client.post(
        "/api/v1/deployments",
        {**BASE, "enable_expert_parallel": True, "data_parallel_size": 2, "npus_per_replica": 2},
        content_type="application/json",
    )
    assert resp.status_code == 201, resp.content
    assert resp.json()["data_parallel_size"] == 2
