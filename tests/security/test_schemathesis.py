"""Promise: no input generated from the API's own OpenAPI schema — valid or not — makes the
API answer 5xx, and what it answers has the documented content type and, for documented
statuses, the documented shape.

Schemathesis generates the requests (both schema-conforming and schema-violating ones,
NUL bytes included) for every operation and sends them in-process to the WSGI app as an
admin with a write token, so every route is reached past authentication. The number of
examples is bounded (SCHEMATHESIS_EXAMPLES, default 8 per operation and mode) to keep the
run under two minutes on two cores; raise it locally to dig deeper.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from console.api import api
from console.wsgi import application

pytestmark = pytest.mark.security

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "8"))

schema = schemathesis.openapi.from_dict(api.get_openapi_schema())
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    allow_x00=True,
    database="none",
    deterministic=True,
)


@pytest.fixture
def in_test_transaction():
    """Keep the test's database connection open across WSGI requests, as Django's test
    Client does (the handler would close it at the end of each request)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def admin_token(db, in_test_transaction):
    from console.accounts.services import Actor, create_token
    from tests.factories import make_node
    from tests.helpers import make_user

    admin = make_user("fuzz-admin", "admin")
    make_node("kp-01", npus=2)  # something for list and detail routes to find
    return create_token(actor=Actor(user=admin, name="fuzz"), name="fuzz", scope="write")[1]


@schema.parametrize()
@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    deadline=None,
)
def test_api_never_answers_5xx_and_conforms(case, admin_token):
    response = case.call(app=application, headers={"Authorization": f"Bearer {admin_token}"})
    case.validate_response(
        response,
        checks=[not_a_server_error, content_type_conformance, response_schema_conformance],
    )
