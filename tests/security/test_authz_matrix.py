"""Promise: every route answers each kind of caller as docs/security.md says.

Routes come from the URL resolver (pages, the API mounted by ninja, /metrics, the Django
admin), from the OpenAPI schema and from the /v1 gateway's own route table, so a route added
tomorrow is in the matrix without editing this file. A page whose view does not declare a role
(`role_required`) and is not listed in PUBLIC_PAGES with a reason fails the coverage test, and
so does a path parameter no filler knows how to fill with a real object.

Callers: anonymous, a signed-in user with no role, viewer, operator, admin (sessions); a
read-only token, an operator's write token, an admin's write token, an expired, a revoked and
a made-up token. Path parameters are filled with real rows made by factories, so "allowed"
means the request reached the view (no 401/403, no redirect to sign-in, never a 5xx).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from console.accounts.models import ApiToken
from console.accounts.services import Actor, create_token, revoke_token
from tests.helpers import make_user
from tests.kit import closed_port, make_deployment, make_node, make_replica

pytestmark = pytest.mark.security

RANK = {None: 0, "viewer": 1, "operator": 2, "admin": 3}
SAFE = {"GET", "HEAD", "OPTIONS"}

# Pages reachable without a console role, each with the reason.
PUBLIC_PAGES = {
    "login": "the sign-in form itself (rate-limited, tests/security/test_login_rate_limit.py)",
    "logout": "ends the caller's own session; POST only, CSRF-checked",
    "api-docs-redirect": "a redirect to /api/v1/docs, which needs sign-in itself",
    "password-change": "one's own password, for any signed-in user, role or not "
    "(tests/console/accounts/test_first_password.py)",
}
# Routes outside the page rules, each tested on its own below.
SELF_AUTHENTICATING = {
    "metrics": "bearer token of a viewer (Prometheus cannot hold a session)",
}
# Resolver routes under api/v1/ that are not OpenAPI operations.
API_NON_OPERATIONS = {
    "": "ninja's API root (404 page listing nothing)",
    "docs": "Swagger UI, for a signed-in viewer (test_api_docs_need_login)",
    "openapi.json": "the schema, for a viewer's session or token (test_api_docs_need_login)",
}
# API operations that need the admin role (everything else: viewer reads, operator writes).
ADMIN_ONLY_API = {
    ("GET", "/api/v1/enrollment-tokens"),
    ("POST", "/api/v1/enrollment-tokens"),
    ("POST", "/api/v1/enrollment-tokens/{token_id}/revoke"),
    ("POST", "/api/v1/nodes/{name}/address/accept"),
    # node identity: credentials are seen and changed by admins only
    ("GET", "/api/v1/nodes/{name}/credentials"),
    ("POST", "/api/v1/nodes/{name}/credentials/rotate"),
    ("POST", "/api/v1/nodes/{name}/credentials/revoke"),
    ("POST", "/api/v1/nodes/{name}/reenroll"),
    # incident webhooks: endpoints and their secrets are changed by admins only
    ("POST", "/api/v1/webhooks"),
    ("PATCH", "/api/v1/webhooks/{webhook_id}"),
    ("DELETE", "/api/v1/webhooks/{webhook_id}"),
    ("POST", "/api/v1/webhooks/{webhook_id}/test"),
    # gateway rate limits
    ("PUT", "/api/v1/gateway/limits"),
    ("DELETE", "/api/v1/gateway/limits/{limit_id}"),
}
# Reads that need the operator role: the audit log (as its page, /audit/).
OPERATOR_READS = {("GET", "/api/v1/audit")}
# Valid bodies where "{}" would fail validation before the role is checked.
BODIES = {
    ("POST", "/api/v1/enrollment-tokens"): '{"name": "matrix"}',
    ("POST", "/api/v1/nodes/{name}/credentials/revoke"): '{"reason": "matrix"}',
    ("POST", "/api/v1/webhooks"): '{"name": "matrix", "url": "http://127.0.0.1:9/hook"}',
    ("PUT", "/api/v1/gateway/limits"): '{"requests_per_minute": 5}',
}


# --- route discovery --------------------------------------------------------------------------
def walk(patterns, prefix=""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p


def page_name(route: str, pattern: URLPattern) -> str:
    return pattern.name or ("api-docs-redirect" if route == "api/docs" else route)


def page_routes() -> list[tuple[str, URLPattern]]:
    """Every resolver route that is not the API, the admin site or static files."""
    return [
        (route, p)
        for route, p in walk(get_resolver().url_patterns)
        if not route.startswith(("api/v1/", "admin/", "static/", "^static"))
    ]


def api_resolver_routes() -> set[str]:
    """API routes from the resolver, as OpenAPI-style templates relative to /api/v1/."""
    found = set()
    for route, _ in walk(get_resolver().url_patterns):
        if route.startswith("api/v1/"):
            found.add(re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route[len("api/v1/") :]))
    return found


def api_operations() -> list[tuple[str, str, dict]]:
    from console.api import api

    schema = api.get_openapi_schema()
    return [
        (method.upper(), path, op)
        for path, methods in schema["paths"].items()
        for method, op in methods.items()
    ]


def gateway_routes() -> list[tuple[str, str]]:
    try:
        from console.gateway.app import app
    except ImportError:  # the gateway is optional in this matrix until it exists
        return []
    return [(m, r.path) for r in app.routes for m in sorted(r.methods or ()) if m != "HEAD"]


# --- a world of real objects ------------------------------------------------------------------
@dataclass
class World:
    node: object
    accelerator: object
    deployment: object
    replica: object
    incident: object
    api_token: object
    enrollment_token: object
    benchmark_run: object | None
    webhook: object
    rate_limit: object


def make_world(owner) -> World:
    from console.diagnosis.models import Incident
    from console.inventory.enrollment import create_enrollment_token

    node = make_node("kp-01", npus=2)
    dep = make_deployment(
        "dep-1", model_path="/models/tiny", served_model_name="tiny", device="cpu"
    )
    replica = make_replica(dep, node=node, state="pending")
    incident = Incident.objects.create(
        category="engine", title="engine crashed", fingerprint="fp-1", node=node, replica=replica
    )
    api_token, _ = create_token(actor=Actor(user=owner, name=owner.username), name="victim")
    enrollment, _ = create_enrollment_token(actor=Actor(user=owner, name="ada"), name="rack")
    run = None
    try:
        from console.benchmarks.models import BenchmarkRun

        run = BenchmarkRun.objects.create(
            deployment=dep, prompt_tokens=8, output_tokens=8, concurrency=1, duration_s=5
        )
    except ImportError:
        pass
    from console.diagnosis.models import WebhookEndpoint
    from console.gateway.models import RateLimit

    webhook = WebhookEndpoint.objects.create(  # a test delivery is refused at once
        name="matrix", url=f"http://127.0.0.1:{closed_port()}/hook", secret="s" * 32
    )
    limit = RateLimit.objects.create(token=api_token, requests_per_minute=1000)
    return World(
        node,
        node.accelerators.first(),
        dep,
        replica,
        incident,
        api_token,
        enrollment,
        run,
        webhook,
        limit,
    )


def filler(world: World, route: str, param: str) -> str:
    """A real value for one path parameter; fails the test for a parameter nobody fills."""
    if param == "name":
        return world.deployment.name if "deployments" in route else world.node.name
    if param == "token_id":
        return str((world.enrollment_token if "enrollment" in route else world.api_token).pk)
    if param == "model_id":  # the model catalog (console/deployments/catalog.yaml)
        from console.deployments.catalog import load_catalog

        return next(iter(load_catalog().models))
    values = {
        "accelerator_id": world.accelerator.pk,
        "replica_id": world.replica.pk,
        "inspection_id": world.node.model_inspections.get_or_create(path="/models/tiny")[0].pk,
        "incident_id": world.incident.pk,
        "run_id": world.benchmark_run.pk if world.benchmark_run else None,
        "webhook_id": world.webhook.pk,
        "limit_id": world.rate_limit.pk,
        "action": "stop",
        "code": "80E01801",
    }
    if values.get(param) is None:
        pytest.fail(f"no filler for path parameter {param!r} of {route}: add one to filler()")
    return str(values[param])


def concrete(world: World, route: str) -> str:
    """/api/v1/x/{id} or x/<int:id>/ with real values."""
    route = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: filler(world, route, m.group(1)), route)
    route = re.sub(r"\{(\w+)\}", lambda m: filler(world, route, m.group(1)), route)
    return route if route.startswith("/") else "/" + route


# --- callers -----------------------------------------------------------------------------------
@dataclass
class Caller:
    name: str
    role: str | None = None  # the role the caller acts with
    session: bool = False
    token: str | None = None  # raw bearer value
    writes: bool = True  # False for a read-only token
    valid: bool = True  # False: anonymous, expired, revoked, made-up


CALLERS = [
    "anonymous",
    "no-role",
    "viewer",
    "operator",
    "admin",
    "read-token",
    "operator-write-token",
    "admin-write-token",
    "viewer-token",
    "no-role-token",
    "expired-token",
    "revoked-token",
    "made-up-token",
]


def make_caller(name: str) -> Caller:
    users = {r: make_user(f"u-{r or 'none'}", r) for r in ("viewer", "operator", "admin", None)}

    def token(role, scope="read", **kw) -> str:
        user = users[role]
        return create_token(actor=Actor(user=user, name="t"), name=name, scope=scope, **kw)[1]

    if name == "anonymous":
        return Caller(name, valid=False)
    if name in ("no-role", "viewer", "operator", "admin"):
        role = None if name == "no-role" else name
        return Caller(name, role=role, session=True)
    if name == "read-token":
        return Caller(name, "operator", token=token("operator"), writes=False)
    if name == "no-role-token":
        return Caller(name, None, token=token(None, "write"))
    if name == "viewer-token":
        return Caller(name, "viewer", token=token("viewer"), writes=False)
    if name == "operator-write-token":
        return Caller(name, "operator", token=token("operator", "write"))
    if name == "admin-write-token":
        return Caller(name, "admin", token=token("admin", "write"))
    if name == "expired-token":
        raw = token("admin", "write", expires_at=timezone.now() + timedelta(seconds=30))
        ApiToken.objects.filter(name=name).update(expires_at=timezone.now() - timedelta(seconds=1))
        return Caller(name, "admin", token=raw, valid=False)
    if name == "revoked-token":
        raw = token("admin", "write")
        t = ApiToken.objects.get(name=name)
        revoke_token(actor=Actor(user=users["admin"], name="ada"), token_id=t.pk)
        return Caller(name, "admin", token=raw, valid=False)
    assert name == "made-up-token"
    return Caller(name, "admin", token=ApiToken.generate(), valid=False)


def client_for(caller: Caller) -> Client:
    client = Client()
    if caller.session:
        from django.contrib.auth import get_user_model

        client.force_login(get_user_model().objects.get(username=f"u-{caller.role or 'none'}"))
    if caller.token:
        client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {caller.token}"
    return client


# --- expectations -------------------------------------------------------------------------------
def to_login(resp) -> bool:
    return resp.status_code == 302 and resp["Location"].startswith("/login/")


def allowed(resp) -> bool:
    return resp.status_code < 500 and resp.status_code not in (401, 403) and not to_login(resp)


def check_page(caller: Caller, method: str, required: str, resp) -> str | None:
    """None when the response is the one promised, else what was wrong."""
    if resp.status_code >= 500:
        return f"server error {resp.status_code}"
    if not caller.session:  # tokens do not open pages: a page wants a session
        return None if to_login(resp) else f"{resp.status_code}, not a redirect to sign-in"
    if RANK[caller.role] >= RANK[required]:
        return None if allowed(resp) else f"refused with {resp.status_code}"
    # 405: the view refuses the method before doing anything, whoever asks
    return None if resp.status_code in (403, 405) else f"{resp.status_code}, not 403"


def check_api(caller: Caller, method: str, path: str, op: dict, resp) -> str | None:
    code = resp.status_code
    if code >= 500:
        return f"server error {code}"
    if not caller.valid:
        return None if code == 401 else f"{code}, not 401"
    need = "admin" if (method, path) in ADMIN_ONLY_API else "viewer"
    if (method, path) in OPERATOR_READS:
        need = "operator"
    reads = method in SAFE or op.get("x-read-only")
    if not reads:
        need = max(need, "operator", key=RANK.get)
    ok = RANK[caller.role] >= RANK[need] and (reads or caller.writes)
    if ok:
        return None if allowed(resp) else f"refused with {code}: {resp.content[:200]!r}"
    return None if code == 403 else f"{code}, not 403"


# --- coverage: nothing escapes the matrix ----------------------------------------------------
def test_every_page_declares_its_role_or_is_listed_public(db):
    missing = []
    for route, pattern in page_routes():
        name = page_name(route, pattern)
        if name in PUBLIC_PAGES or name in SELF_AUTHENTICATING:
            continue
        if getattr(pattern.callback, "required_role", None) not in ("viewer", "operator", "admin"):
            missing.append(f"{route} ({name})")
    assert not missing, f"pages without role_required and not listed public: {missing}"
    assert len(page_routes()) >= 30  # the walk really found them


def test_every_api_route_is_an_operation_in_the_schema(db):
    operations = {path[len("/api/v1/") :] for _, path, _ in api_operations()}
    routes = api_resolver_routes()
    assert routes - operations == set(API_NON_OPERATIONS), (
        "API routes that are not documented operations (so not in the matrix): "
        f"{sorted(routes - operations - set(API_NON_OPERATIONS))}"
    )
    assert operations <= routes
    assert len(api_operations()) >= 40


def test_matrix_expectations_list_only_real_operations(db):
    ops = {(m, p) for m, p, _ in api_operations()}
    listed = ADMIN_ONLY_API | OPERATOR_READS | set(BODIES)
    assert listed <= ops, listed - ops


# --- the matrix ------------------------------------------------------------------------------
@pytest.fixture
def world(db):
    return make_world(make_user("owner", "admin"))


@pytest.mark.parametrize("caller_name", CALLERS)
def test_page_matrix(world, caller_name):
    caller = make_caller(caller_name)
    client = client_for(caller)
    wrong, checked = [], 0
    routes = [
        (r, p)
        for r, p in page_routes()
        if page_name(r, p) not in PUBLIC_PAGES | SELF_AUTHENTICATING.keys()
    ]
    for method in ("GET", "POST"):  # reads first: a POST may stop or revoke what a GET shows
        for route, pattern in routes:
            path = concrete(world, route)
            resp = client.generic(method, path)
            problem = check_page(caller, method, pattern.callback.required_role, resp)
            if problem:
                wrong.append(f"{method} {path}: {problem}")
            checked += 1
    assert not wrong, f"{caller.name}:\n" + "\n".join(wrong)
    assert checked >= 60


@pytest.mark.parametrize("caller_name", CALLERS)
def test_api_matrix(world, caller_name):
    caller = make_caller(caller_name)
    client = client_for(caller)
    ops = api_operations()
    # reads, then writes, then deletes: each request finds the objects the previous left
    ops.sort(key=lambda o: (o[0] not in SAFE, o[0] == "DELETE"))
    wrong = []
    for method, path, op in ops:
        url = concrete(world, path)
        body = BODIES.get((method, path), "{}")
        resp = client.generic(method, url, data=body, content_type="application/json")
        problem = check_api(caller, method, path, op, resp)
        if problem:
            wrong.append(f"{method} {url}: {problem}")
    assert not wrong, f"{caller.name}:\n" + "\n".join(wrong)


@pytest.mark.parametrize("caller_name", CALLERS)
def test_metrics_needs_a_viewer_token(world, caller_name):
    caller = make_caller(caller_name)
    resp = client_for(caller).get("/metrics")
    if caller.token and caller.valid:
        assert resp.status_code == (200 if caller.role else 403)
    else:  # a session is not enough: Prometheus scrapes with a token
        assert resp.status_code == 401


@pytest.mark.parametrize("caller_name", ["anonymous", "viewer", "operator", "admin"])
def test_django_admin_needs_staff(world, caller_name):
    """The console's roles do not open Django's admin site; only staff accounts do."""
    client = client_for(make_caller(caller_name))
    for path in ("/admin/", "/admin/auth/user/", "/admin/accounts/apitoken/"):
        resp = client.get(path)
        assert resp.status_code == 302, (path, resp.status_code)
        assert "/login/" in resp["Location"], (path, resp["Location"])


def test_api_docs_need_login(db):
    for path in ("/api/docs", "/api/v1/docs"):
        resp = Client().get(path, follow=True)
        assert resp.redirect_chain and "/login/" in resp.redirect_chain[-1][0], path
    # the schema answers a client generator, not a browser: 401, no redirect
    assert Client().get("/api/v1/openapi.json").status_code == 401


@pytest.mark.parametrize("caller_name", CALLERS)
def test_gateway_matrix(transactional_db, caller_name):
    """/v1 (the OpenAI-compatible gateway, an ASGI app beside Django): any valid token of a
    user with a role, read-only ones included (inference changes nothing in the console);
    sessions, role-less users' tokens and everything else get 401."""
    routes = gateway_routes()
    if not routes:
        pytest.skip("no gateway in this tree")
    from starlette.testclient import TestClient

    from console.asgi import application

    caller = make_caller(caller_name)
    headers = {"Authorization": f"Bearer {caller.token}"} if caller.token else {}
    wrong = []
    with TestClient(application) as client:
        for method, path in routes:
            body = {"model": "no-such-model", "prompt": "hi", "max_tokens": 1}
            resp = client.request(
                method, path, headers=headers, json=body if method == "POST" else None
            )
            code = resp.status_code
            if caller.token and caller.valid and caller.role:
                ok = code < 500 or code == 503  # 503: no replica ready, after auth
                ok = ok and code not in (401, 403)
            else:
                ok = code == 401
            if not ok:
                wrong.append(f"{method} {path}: {code} {resp.text[:200]}")
    assert not wrong, f"{caller.name}:\n" + "\n".join(wrong)
