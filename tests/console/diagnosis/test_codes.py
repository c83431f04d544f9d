"""The published code tables: loaded whole, every entry sourced, looked up by an on-call
engineer on the rules page and through the API, and recognised in log lines."""

from __future__ import annotations

import json

import pytest

from console.diagnosis import codes
from console.diagnosis.matcher import diagnose
from console.diagnosis.recognisers import classify, vocabulary
from console.diagnosis.rulebook import rulebook


def test_the_tables_are_complete_and_every_entry_has_a_source_and_a_known_category():
    book = codes.load()
    kinds = {}
    for entry in book.codes.values():
        kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
        assert entry.source_url.startswith("https://github.com/"), entry.code
        assert entry.category in rulebook().categories, entry.code
    assert kinds["acl"] >= 200  # ACL + runtime (107/207/507/5079) + graph engine
    assert kinds["message"] >= 406  # the error_code.json catalogue at least
    assert kinds["dcmi"] >= 20
    runtime = [c for c in book.codes if c.startswith("507")]
    assert len(runtime) > 37  # past 507036, where older copies of rt_error_codes.h stop


@pytest.mark.parametrize(
    ("code", "category", "exact"),
    [
        ("507035", "op-exception", True),  # ACL_ERROR_RT_VECTOR_CORE_EXCEPTION
        ("EI0006", "hccl-failure", True),
        ("ei0006", "hccl-failure", True),
        ("EL0004", "npu-oom", True),
        ("-8020", "device-busy", True),
        ("EI0999", "hccl-failure", False),  # unknown code of a known module: the module's
        ("107999", "config-invalid", False),  # unknown runtime code: its class's
    ],
)
def test_lookup(code, category, exact):
    entry = codes.codebook().lookup(code)
    assert entry is not None and entry.category == category and entry.exact is exact


def test_lookup_of_nothing_known():
    assert codes.codebook().lookup("EX1234") is None
    assert codes.codebook().lookup("hello") is None


def test_codes_are_found_by_shape_and_context_not_in_any_number():
    found = codes.find_codes("RuntimeError: ACL stream synchronize failed, error code:507035")
    assert [e.code for e in found] == ["507035"]
    assert codes.find_codes("started worker pid 507035 at 12:00") == []
    assert [e.code for e in codes.find_codes("dcmi module initialize failed. ret is -8005")] == [
        "-8005"
    ]
    assert [e.code for e in codes.find_codes("[ERROR] EI0006: Getting socket times out")] == [
        "EI0006"
    ]


def test_a_code_without_a_rule_still_gets_its_table_meaning_with_lower_confidence():
    found = diagnose("[ERROR] RUNTIME: rtStreamSynchronize failed, error code is 507048")
    top = found[0]
    assert top.rule == "code:507048" and top.confidence in {"medium", "low"}
    assert top.links and top.links[0]["url"].startswith("https://github.com/hicann/")


def test_the_new_users_lines_from_the_issue_are_recognised():
    hccl = diagnose("[ERROR] HCCL(1234,python):2025-01-01 wait socket establish timeout, role[0]")
    assert hccl and hccl[0].category == "hccl-failure"
    module = diagnose(
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "ModuleNotFoundError: No module named 'vllm'"
    )
    assert module[0].category == "version-mismatch" and not module[0].symptom
    assert module[0].evidence and "No module named 'vllm'" in module[0].evidence[0].text


def test_only_symptoms_say_so_and_what_to_collect_next():
    found = diagnose(
        "ERROR [core.py:1] EngineCore failed to start.\nvllm.v1.engine.exceptions.EngineDeadError:"
        " EngineCore encountered an issue."
    )
    assert found and all(d.symptom for d in found)
    assert found[0].collect_next and any("plog" in step for step in found[0].collect_next)


@pytest.mark.parametrize("word", vocabulary(), ids=lambda w: w.entry.id)
def test_every_vocabulary_entry_reads_its_examples_and_not_its_counters(word):
    from console.diagnosis.recognisers import read_line

    for example in word.entry.examples:
        reading = read_line(example.text, error_line=True)
        assert reading is not None and reading.entry == word.entry, example.text
    for counter in word.entry.counter:
        reading = read_line(counter.text, error_line=True)
        assert reading is None or reading.entry != word.entry, counter.text
    assert classify(None, "") is None


def test_api_looks_up_a_code(viewer_client):
    resp = viewer_client.get("/api/v1/diagnose/codes/507035")
    assert resp.status_code == 200
    body = resp.json()
    assert (
        body["name"] == "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION" and body["category"] == "op-exception"
    )
    assert body["source"]["url"].startswith("https://github.com/hicann/runtime/")
    unknown = viewer_client.get("/api/v1/diagnose/codes/EX1234")
    assert unknown.status_code == 422 and unknown.json()["field"] == "code"


def test_rules_page_looks_up_a_code(viewer_client):
    page = viewer_client.get("/diagnose/rules/", {"code": "EI0006"}).content.decode()
    assert "data-code-result" in page and "hccl-failure" in page and "EI0006" in page
    fault = viewer_client.get("/diagnose/rules/", {"code": "80E01801"}).content.decode()
    assert "handling level" in fault
    nothing = viewer_client.get("/diagnose/rules/", {"code": "EX1234"}).content.decode()
    assert "No Ascend code" in nothing


def test_the_api_runs_within_a_time_limit(viewer_client, monkeypatch):
    from console.diagnosis import services

    monkeypatch.setattr(services, "TIME_LIMIT_S", -1.0)  # already passed: the pass stops at once
    resp = viewer_client.post(
        "/api/v1/diagnose", data=json.dumps({"text": "x\n" * 1000}), content_type="application/json"
    )
    assert resp.status_code == 422 and resp.json()["field"] == "text"
    assert "took longer" in resp.json()["message"]
