"""The command, the API and the page give the same diagnoses; API auth and size limits."""

from __future__ import annotations

import io
import json
import re
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from console.accounts.services import Actor, create_token
from console.diagnosis.matcher import diagnose
from console.diagnosis.services import MAX_TEXT_BYTES
from tests.console.diagnosis.samples import log_text, resolve

AGREE_ON = [
    "err-oom-npu-out-of-memory-ray-deepseek-w8a8-hccl-warning.txt",
    "err-507011-event-query-fftsplus-aicore-hccl-watchdog.txt",
    "err-hccl-allreduce-error-6-ei0006-remote-rank-stuck.txt",
    "err-libascend-hal-not-found-docker-missing-mounts.txt",
]


def _command_json(path) -> list[dict]:
    out = io.StringIO()
    call_command("diagnose", str(path), "--json", stdout=out)
    return json.loads(out.getvalue())


def _api(client, **body):
    return client.post("/api/v1/diagnose", data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("name", AGREE_ON)
def test_command_api_and_page_agree(name, viewer_client, tmp_path):
    text = log_text(resolve(name))
    expected = [d.as_dict() for d in diagnose(text)]
    assert expected
    log = tmp_path / "engine.log"
    log.write_text(text)
    assert _command_json(log) == expected
    resp = _api(viewer_client, text=text)
    assert resp.status_code == 200
    assert resp.json() == expected
    page = viewer_client.post("/diagnose/", {"text": text}, headers={"HX-Request": "true"})
    assert page.status_code == 200
    rules_on_page = re.findall(r'data-rule="([^"]+)"', page.content.decode())
    assert rules_on_page == [d["rule"] for d in expected]


def test_command_reads_stdin_and_prints_a_readable_report(monkeypatch):
    text = log_text(resolve("err-oom-npu-out-of-memory-v071.txt"))
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    out = io.StringIO()
    call_command("diagnose", "-", stdout=out)
    report = out.getvalue()
    assert report.startswith("1. [critical] NPU out of memory")
    assert "line 1: > > RuntimeError: NPU out of memory." in report
    assert "1. Lower the memory vLLM claims" in report


def test_command_exit_codes(tmp_path):
    quiet = tmp_path / "npu-smi.txt"
    quiet.write_text(log_text(resolve("npu-smi-info-910b4-single.txt")))
    out = io.StringIO()
    call_command("diagnose", str(quiet), stdout=out)  # nothing matched: exit 0, says so
    assert out.getvalue().strip() == "No known failure pattern matched."
    assert _command_json(quiet) == []
    with pytest.raises(CommandError) as exc:
        call_command("diagnose", str(tmp_path / "missing.log"))
    assert exc.value.returncode == 2


def test_command_passes_exit_code_and_health(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    out = io.StringIO()
    call_command(
        "diagnose", str(empty), "--json", "--exit-code", "137", "--health", "Alarm", stdout=out
    )
    assert [d["rule"] for d in json.loads(out.getvalue())] == [
        "npu-health-degraded",
        "killed-by-sigkill",
    ]


def test_api_needs_a_signed_in_viewer(db, viewer):
    assert _api(Client(), text="x").status_code == 401
    resp = _api(Client(), text="x")
    assert resp.json()["message"]
    nobody = Client()
    from tests.helpers import make_user

    nobody.force_login(make_user("norole", None))
    assert _api(nobody, text="x").status_code == 403


def test_api_answers_a_viewer_session_and_a_read_only_token(viewer_client, viewer):
    assert _api(viewer_client, text="all good").json() == []
    _, raw = create_token(actor=Actor(user=viewer, name="vera"), name="ci")
    resp = Client().post(
        "/api/v1/diagnose",
        data=json.dumps({"text": "OSError: [Errno 98] Address already in use", "exit_code": 1}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {raw}"},
    )
    assert resp.status_code == 200
    assert [d["rule"] for d in resp.json()] == ["port-in-use"]


def test_api_refuses_oversize_text_naming_the_field(viewer_client):
    resp = _api(viewer_client, text="x" * (MAX_TEXT_BYTES + 1))
    assert resp.status_code == 422
    assert resp.json()["field"] == "text"
    ok = _api(viewer_client, text="é" * (MAX_TEXT_BYTES // 2))  # exactly 5 MB of UTF-8
    assert ok.status_code == 200


def test_api_validation_errors_are_422_json(viewer_client):
    resp = _api(viewer_client, exit_code=1)
    assert resp.status_code == 422 and resp.json()["field"] == "text"
    resp = _api(viewer_client, text="x", health="Smoking")
    assert resp.status_code == 422 and resp.json()["field"] == "health"
    resp = viewer_client.post("/api/v1/diagnose", data="{not json", content_type="application/json")
    assert resp.status_code == 422 and resp.json()["field"] == "body"


def test_fault_code_lookup(viewer_client):
    body = viewer_client.get("/api/v1/diagnose/fault-codes/80E01801").json()
    assert body == {
        "code": "80E01801",
        "level": "RestartBusiness",
        "action": body["action"],
        "known": True,
    }
    assert viewer_client.get("/api/v1/diagnose/fault-codes/zz").status_code == 422


def test_page_shows_ranked_findings_with_evidence_and_commands(viewer_client):
    assert viewer_client.get("/diagnose/").status_code == 200
    text = log_text(resolve("err-kv-cache-negative-memory-qwen3-14b-32g.txt"))
    html = viewer_client.post("/diagnose/", {"text": text}).content.decode()
    assert "Most likely: No memory left for the KV cache" in html
    assert '<span class="lvl-error">line 7: Available KV cache memory: -0.87 GiB</span>' in html
    assert "<code>--tensor-parallel-size 2</code>" in html
    assert '<ol class="remediation">' in html
    partial = viewer_client.post(
        "/diagnose/", {"text": "nothing to see"}, headers={"HX-Request": "true"}
    )
    body = partial.content.decode()
    assert "No known failure pattern matched" in body and "<html" not in body


def test_page_takes_an_uploaded_file_and_reports_bad_input(viewer_client):
    upload = io.BytesIO(b"OSError: [Errno 98] Address already in use\n")
    upload.name = "engine.log"
    resp = viewer_client.post("/diagnose/", {"file": upload, "exit_code": "1"})
    assert [d["rule"] for d in resp.context["diagnoses"]] == ["port-in-use"]
    resp = viewer_client.post("/diagnose/", {"text": "x", "exit_code": "one"})
    assert resp.context["error_field"] == "exit_code"
    assert "alert alert--error" in resp.content.decode()


def test_rules_page_lists_rules_folklore_and_fault_levels(viewer_client):
    html = viewer_client.get("/diagnose/rules/").content.decode()
    assert 'data-filter-table="#rules"' in html and '<table class="table" id="rules"' in html
    assert 'id="rule-npu-oom-torch-npu"' in html
    assert "block_size to 16MB" in html and "SeparateNPU" in html


def test_pages_need_login(db):
    resp = Client().get("/diagnose/")
    assert resp.status_code == 302 and "login" in resp["Location"]
