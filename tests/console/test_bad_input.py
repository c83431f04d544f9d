"""Bad input to every write endpoint gets a 4xx JSON answer naming the field, never a 500.

Write endpoints come from the OpenAPI schema, so a new one is covered without editing this.
"""

from __future__ import annotations

import re

from console.api import api
from tests.factories import make_node


def write_operations():
    schema = api.get_openapi_schema()
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            if method.upper() in {"GET", "HEAD", "OPTIONS"}:
                continue
            yield method.upper(), path, op


def fill(path: str, value: str) -> str:
    return re.sub(r"\{[^}]+\}", value, path)


BAD_BODIES = [
    "[]",
    '{"labels": 5, "action": 7, "reason": ["x"], "name": {}, "scope": "root"}',
    "not json",
    "{}",
]


def test_every_write_endpoint_names_the_bad_field(admin_client_):
    node = make_node("node-1", npus=1)
    acc_id = node.accelerators.get().pk
    ops = list(write_operations())
    assert len(ops) >= 5
    for method, path, op in ops:
        good_id = "node-1" if "{name}" in path else str(acc_id)
        has_body = "requestBody" in op
        if "{" in path:  # a path parameter of the wrong type or unknown value
            resp = admin_client_.generic(
                method, fill(path, "-1"), data="{}", content_type="application/json"
            )
            assert 400 <= resp.status_code < 500, (method, path, resp.status_code)
            assert "message" in resp.json()
        if not has_body:
            continue
        for body in BAD_BODIES:
            resp = admin_client_.generic(
                method, fill(path, good_id), data=body, content_type="application/json"
            )
            assert 400 <= resp.status_code < 500, (
                method,
                path,
                body,
                resp.status_code,
                resp.content,
            )
            payload = resp.json()
            assert payload["message"], (method, path, body)
            if body != "not json":
                assert payload["field"], (method, path, body, payload)


def test_non_integer_path_id_is_a_422_naming_it(operator_client):
    resp = operator_client.post(
        "/api/v1/accelerators/abc/isolate", {"reason": "x"}, content_type="application/json"
    )
    assert resp.status_code == 422
    assert resp.json()["field"] == "accelerator_id"


def test_times_need_an_offset_and_are_kept_in_utc(admin_client_):
    # PostgreSQL refuses offsets past 15:59: `since=…+20:51` was a 500 from the audit list.
    resp = admin_client_.get("/api/v1/audit", {"since": "2020-09-11T01:14:08+20:51"})
    assert resp.status_code == 200, resp.content
    naive = admin_client_.get("/api/v1/audit", {"since": "2020-09-11T01:14:08"})
    assert naive.status_code == 422 and naive.json()["field"] == "since"
    overflow = admin_client_.get("/api/v1/audit", {"since": "0001-01-01T00:00:00+01:00"})
    assert overflow.status_code == 422 and overflow.json()["field"] == "since"


def test_token_expiry_is_stored_in_utc_and_a_bare_time_is_refused(admin_client_):
    def create(expires_at: str):
        body = {"name": "t", "expires_at": expires_at}
        return admin_client_.post("/api/v1/tokens", body, content_type="application/json")

    made = create("2999-01-01T20:00:00+20:51")
    assert made.status_code == 201, made.content
    assert made.json()["expires_at"].startswith("2998-12-31T23:09:00")
    for bad in ("2999-01-01T00:00:00", "9999-12-31T23:59:59-05:00"):
        resp = create(bad)
        assert resp.status_code == 422 and resp.json()["field"] == "expires_at", (bad, resp.content)
