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
