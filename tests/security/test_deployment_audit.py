"""Promise: `deployment.create` and `deployment.delete` audit entries hold the whole spec
(after, resp. before) as a viewer is shown it — every field, secrets masked the same way:
secret-named env values, secret flags' values and passwords inside URLs."""

from __future__ import annotations

import pytest

from console.accounts.models import AuditEntry
from console.deployments.schemas import DeploymentIn
from tests.console.deployments.conftest import QWEN_7B_LIKE
from tests.kit import make_node

pytestmark = [pytest.mark.security, pytest.mark.django_db]

SECRET = "hf_abcdefghijklmnopqrstu"
PROXY_PASSWORD = "proxy-pw-9f2c"
SPEC = {
    "name": "r1-7b",
    "model_path": "/models/DeepSeek-R1-Distill-Qwen-7B",
    "served_model_name": "r1-7b",
    "max_model_len": 8192,
    "extra_args": ["--hf-token", SECRET],
    "extra_env": {
        "HF_TOKEN_X": SECRET,
        "HF_ENDPOINT": f"https://mirror:{PROXY_PASSWORD}@hf-mirror.internal",
        "VLLM_LOGGING_LEVEL": "INFO",
    },
}
URL = "/api/v1/deployments/r1-7b"


@pytest.fixture
def inspected(monkeypatch):
    make_node("kp-01", npus=8)
    monkeypatch.setattr(
        "console.deployments.services.inspect_model",
        lambda node, path, timeout=20.0: dict(QWEN_7B_LIKE, path=path),
    )
    monkeypatch.setattr("console.deployments.services._kick_reconcile", lambda: None)


def test_create_and_delete_record_the_whole_spec_masked(operator_client, inspected):
    resp = operator_client.post("/api/v1/deployments", SPEC, content_type="application/json")
    assert resp.status_code == 201, resp.content
    shown = operator_client.get(URL).json()

    created = AuditEntry.objects.get(action="deployment.create")
    assert created.before is None and created.actor == "otto"
    spec = created.after["spec"]
    assert set(DeploymentIn.model_fields) - {"desired_state"} <= set(spec)
    assert spec["name"] == "r1-7b" and spec["max_model_len"] == 8192
    for key in set(spec) & set(shown) - {"pinned_node"}:
        assert spec[key] == shown[key], key  # the same values (and masks) a viewer sees
    assert spec["extra_env"]["HF_ENDPOINT"] == "https://mirror:***@hf-mirror.internal"
    assert spec["extra_env"]["HF_TOKEN_X"] == "***" and spec["extra_args"][-1] == "***"

    assert operator_client.delete(URL).status_code in (200, 204)
    deleted = AuditEntry.objects.get(action="deployment.delete")
    assert deleted.after is None and deleted.before["spec"] == spec

    for entry in (created, deleted):
        text = str([entry.before, entry.after, entry.message])
        assert SECRET not in text and PROXY_PASSWORD not in text
