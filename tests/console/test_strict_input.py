"""Every API input refuses a field it does not know: 422 naming it, nothing created or changed."""

from __future__ import annotations

import json

import pytest

from console.accounts.models import ApiToken
from console.deployments.models import Deployment
from console.schemas import StrictIn

pytestmark = pytest.mark.django_db


def _post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


def test_a_misspelt_deployment_setting_is_refused_with_a_suggestion(operator_client):
    body = {
        "name": "qwen",
        "model_path": "/models/qwen",
        "served_model_name": "qwen",
        "device": "cpu",
        "tensor_paralel_size": 4,
    }
    resp = _post(operator_client, "/api/v1/deployments", body)
    assert resp.status_code == 422
    assert resp.json()["field"] == "tensor_paralel_size"
    assert "did you mean tensor_parallel_size" in resp.json()["message"]
    assert not Deployment.objects.filter(name="qwen").exists()


def test_an_unknown_token_field_makes_no_token(admin_client_):
    before = ApiToken.objects.count()
    resp = _post(admin_client_, "/api/v1/tokens", {"name": "ci", "expires_in_days": 7})
    assert resp.status_code == 422 and resp.json()["field"] == "expires_in_days"
    assert ApiToken.objects.count() == before


def test_every_input_shape_is_strict():
    from console.accounts.schemas import TokenIn
    from console.benchmarks.schemas import BenchmarkIn
    from console.deployments.schemas import DeploymentIn, ScaleIn
    from console.diagnosis.schemas import DiagnoseIn
    from console.inventory import schemas as inventory

    for shape in (
        TokenIn,
        BenchmarkIn,
        DeploymentIn,
        ScaleIn,
        DiagnoseIn,
        inventory.LabelsIn,
        inventory.NodeStateIn,
        inventory.IsolationIn,
        inventory.ReleaseIn,
        inventory.EnrollmentIn,
        inventory.CredentialRevokeIn,
    ):
        assert issubclass(shape, StrictIn), shape
        assert shape.model_config.get("extra") == "forbid", shape


def test_diagnose_refuses_an_unknown_field(viewer_client):
    resp = _post(viewer_client, "/api/v1/diagnose", {"text": "x", "exitcode": 1})
    assert resp.status_code == 422 and resp.json()["field"] == "exitcode"
