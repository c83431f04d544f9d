"""Secrets never reach viewers: extra_args flag values, secret-named extra_env, log tails,
lines read from the host and incident evidence show `***`; the stored spec keeps the real
values, and a GET -> PUT round trip with `***` keeps them."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from console.accounts.models import AuditEntry
from console.deployments.models import Deployment
from console.diagnosis import incidents
from tests.kit import make_deployment, make_node, make_replica
from workers.contracts import EngineReport

SECRET = "hf_abcdefghijklmnopqrstu"
BASE = {
    "name": "r1-7b",
    "model_path": "/models/DeepSeek-R1-Distill-Qwen-7B",
    "served_model_name": "r1-7b",
    "max_model_len": 8192,
}
SPEC = {
    **BASE,
    "max_num_batched_tokens": 8192,  # its flag is shown in full: a count, not a token
    "extra_args": ["--enable-prompt-tokens-details", "--hf-token", SECRET],
    "extra_env": {"HF_TOKEN_X": SECRET, "VLLM_LOGGING_LEVEL": "INFO"},
}
URL = "/api/v1/deployments/r1-7b"


@pytest.fixture
def created(operator_client, fake_inspect, monkeypatch):
    make_node("kp-01", npus=8)
    monkeypatch.setattr("console.deployments.services._kick_reconcile", lambda: None)
    resp = operator_client.post("/api/v1/deployments", SPEC, content_type="application/json")
    assert resp.status_code == 201, resp.content
    return Deployment.objects.get(name="r1-7b")


def test_the_api_shows_secret_flag_values_as_stars_and_stores_them(viewer_client, created):
    body = viewer_client.get(URL).json()
    assert body["extra_args"] == ["--enable-prompt-tokens-details", "--hf-token", "***"]
    assert body["extra_env"] == {"HF_TOKEN_X": "***", "VLLM_LOGGING_LEVEL": "INFO"}
    assert created.extra_args[2] == SECRET and created.extra_env["HF_TOKEN_X"] == SECRET
    assert SECRET not in str(AuditEntry.objects.filter(action="deployment.create").get().after)


def test_the_detail_page_shows_secret_flag_values_as_stars(viewer_client, created):
    body = viewer_client.get("/deployments/r1-7b/").content.decode()
    assert SECRET not in body
    assert "--max-num-batched-tokens 8192" in body
    assert "--enable-prompt-tokens-details --hf-token ***" in body


def test_a_get_put_round_trip_keeps_the_stored_secrets(operator_client, created):
    shown = operator_client.get(URL).json()
    put = {k: shown[k] for k in ("extra_args", "extra_env")} | {**BASE, "max_model_len": 4096}
    put["max_num_batched_tokens"] = shown["max_num_batched_tokens"]
    resp = operator_client.put(URL, put, content_type="application/json")
    assert resp.status_code == 200, resp.content
    created.refresh_from_db()
    assert created.extra_args == SPEC["extra_args"] and created.extra_env == SPEC["extra_env"]
    assert created.max_model_len == 4096
    assert SECRET not in str(AuditEntry.objects.filter(action="deployment.update").get().after)


def test_a_put_with_a_new_value_replaces_the_secret(operator_client, created):
    put = {**SPEC, "extra_args": ["--hf-token=hf_new"], "extra_env": {"HF_TOKEN_X": "new"}}
    assert operator_client.put(URL, put, content_type="application/json").status_code == 200
    created.refresh_from_db()
    assert created.extra_args == ["--hf-token=hf_new"] and created.extra_env == {
        "HF_TOKEN_X": "new"
    }


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("extra_args", {"extra_args": ["--hf-token", SECRET, "--hf-token", "***"]}),
        ("extra_env.HF_TOKEN_2", {"extra_env": {"HF_TOKEN_2": "***"}}),
    ],
)
def test_stars_with_no_stored_secret_behind_them_are_refused(
    operator_client, created, field, change
):
    resp = operator_client.put(URL, {**SPEC, **change}, content_type="application/json")
    assert resp.status_code == 422 and resp.json()["field"] == field
    created.refresh_from_db()
    assert created.extra_args == SPEC["extra_args"]


def _shows_key(body: str) -> bool:
    """The api key k1 as a word of its own: a page's random CSRF token may hold "k1"."""
    return re.search(r"\bk1\b", body) is not None


@pytest.fixture
def leaky_replica(db):
    node = make_node("kp-02", npus=2)
    dep = make_deployment("leaky", model_path="/models/x", served_model_name="x")
    tail = ["INFO ok", f"non-default args: {{'hf_token': '{SECRET}', 'api_key': ['k1', 'k2']}}"]
    return make_replica(dep, node=node, index=0, state="failed", log_tail=tail)


def test_a_replicas_log_tail_is_masked_in_the_api_and_the_page(viewer_client, leaky_replica):
    api = viewer_client.get(f"/api/v1/replicas/{leaky_replica.pk}").json()
    assert api["log_tail"][0] == "INFO ok" and "***" in api["log_tail"][1]
    page = viewer_client.get("/deployments/leaky/").content.decode()
    for body in (str(api), page):
        assert SECRET not in body and not _shows_key(body)


def test_the_log_read_from_the_host_is_masked(viewer_client, leaky_replica, monkeypatch):
    text = f"--api-key k1 k2 --port 8000\nHF_TOKEN={SECRET}\nAuthorization: Bearer abc.def\n"
    monkeypatch.setattr(
        "console.inventory.commands.call", lambda *a, **kw: {"text": text, "path": "/x.log"}
    )
    body = viewer_client.get(f"/deployments/leaky/replicas/{leaky_replica.pk}/log").content
    body = body.decode()
    assert SECRET not in body and not _shows_key(body) and "abc.def" not in body
    assert "--api-key *** *** --port 8000" in body


def test_incident_evidence_and_title_are_masked(leaky_replica):
    report = EngineReport(
        node="kp-02",
        replica_id=leaky_replica.pk,
        generation=1,
        phase="crash-loop",
        reason=f"engine exited: --hf-token {SECRET}",
        exit_code=1,
        at=datetime.now(UTC),
        log_tail=[*leaky_replica.log_tail, "Traceback (most recent call last):"],
    )
    incident = incidents.open_incident_for_replica(leaky_replica, report)
    shown = str([incident.title, incident.evidence, incident.diagnoses])
    shown += str(list(incident.notes.values_list("text", flat=True)))
    assert SECRET not in shown and "k1" not in shown
