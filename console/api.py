"""The one NinjaAPI (`/api/v1`): authentication, authorization by method, error mapping.

Authorization rule, applied to every route in one place: a signed-in viewer may read
(GET/HEAD/OPTIONS); anything else needs the operator role and, through a token, a
write-scoped one. Routes that need more (admin) check it in their service.
"""

from __future__ import annotations

import difflib
import re
from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import DatabaseError
from django.http import Http404, JsonResponse
from django.http.request import RawPostDataException
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, ValidationError
from ninja.errors import HttpError as NinjaHttpError
from ninja.openapi.views import openapi_json
from ninja.security import APIKeyCookie, HttpBearer

from console.accounts.models import Role
from console.accounts.services import (
    actor_from_request,
    authenticate_token,
    check_role,
    check_write,
    has_role,
)
from console.errors import DomainError, Invalid
from console.schemas import StrictIn

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


# A JSON \u0000 escape (not itself escaped) or a raw NUL byte.
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000|\x00")


def _authorize(request) -> None:
    actor = actor_from_request(request)
    check_role(actor, Role.VIEWER)
    if request.method not in SAFE_METHODS:
        check_role(actor, Role.OPERATOR)
        check_write(actor)
    # No input of this API means a NUL, and PostgreSQL text cannot hold one (it was a 500
    # there): refused for every route in this one place, before any handler runs.
    _refuse_nul(request)


def _refuse_nul(request) -> None:
    query = [s for item in request.GET.lists() for s in (item[0], *item[1])]
    if "\x00" in request.path or any("\x00" in s for s in query):
        raise Invalid("NUL bytes are not accepted in paths or query parameters", field="path")
    if request.method in SAFE_METHODS:
        return
    try:
        body = request.body
    except RawPostDataException:  # a multipart body already streamed: its fields are parsed
        return
    if _NUL.search(body):
        raise Invalid("NUL bytes (\\u0000) are not accepted in any field", field="body")


class TokenAuth(HttpBearer):
    """`Authorization: Bearer npc_…` with an active API token."""

    def authenticate(self, request, token: str):
        api_token = authenticate_token(token)
        if api_token is None:
            return None
        request.user = api_token.user
        request.api_token = api_token
        _authorize(request)
        return api_token


class SessionAuth(APIKeyCookie):
    """The browser's session cookie (CSRF-checked for writes, as in django-ninja's own)."""

    param_name = "sessionid"

    def authenticate(self, request, key):
        if not request.user.is_authenticated:
            return None
        _authorize(request)
        return request.user


def _docs_access(view):
    """The docs page and `openapi.json`: a signed-in viewer, or a viewer's bearer token (so
    a client generator reads the schema without a browser session). Anonymous: the page
    sends to sign-in, the schema answers 401; a user without a role gets 403."""
    schema = getattr(view, "func", None) is openapi_json

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        try:
            TokenAuth()(request)  # sets request.user for an active token held by a viewer
        except DomainError as exc:
            return JsonResponse({"message": exc.message, "field": exc.field}, status=exc.status)
        if not request.user.is_authenticated:
            if not schema:
                return redirect_to_login(request.get_full_path())
            message = "authentication required: a session or an active API token"
            return JsonResponse({"message": message, "field": None}, status=401)
        if not has_role(request.user, Role.VIEWER):
            return JsonResponse(
                {"message": "this needs the viewer role", "field": None}, status=403
            )
        return view(request, *args, **kwargs)

    return wrapper


api = NinjaAPI(
    title="NPU Console API",
    version="1",
    description="Nodes, NPUs, deployments and diagnosis for vLLM on Ascend.",
    auth=[TokenAuth(), SessionAuth(csrf=True)],
    urls_namespace="api",
    docs_url="/docs",
    docs_decorator=_docs_access,
)


def _error(request, status: int, message: str, field: str | None = None, errors=None):
    body = {"message": message, "field": field}
    if errors is not None:
        body["errors"] = errors
    return api.create_response(request, body, status=status)


def _field(loc) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in {"body", "query", "path", "header", "cookie", "form"}:
        parts = parts[1:]
    if parts and parts[0] == "payload":
        parts = parts[1:]
    return ".".join(parts) or "body"


def _message(error: dict, known: list[str]) -> str:
    if error.get("type") != "extra_forbidden":
        return error.get("msg", "invalid")
    name = str((error.get("loc") or ("",))[-1])
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown field{hint}: nothing was changed"


def _input_fields() -> list[str]:
    """Every field of every API input shape: the vocabulary of a did-you-mean."""
    names, todo = set(), [StrictIn]
    while todo:
        cls = todo.pop()
        names.update(cls.model_fields)
        todo.extend(cls.__subclasses__())
    return sorted(names)


@api.exception_handler(ValidationError)
def on_validation(request, exc: ValidationError):
    known = _input_fields()
    errors = [
        {"field": _field(e.get("loc", ())), "message": _message(e, known)} for e in exc.errors
    ]
    first = errors[0] if errors else {"field": "body", "message": "invalid input"}
    return _error(request, 422, f"{first['field']}: {first['message']}", first["field"], errors)


@api.exception_handler(DomainError)
def on_domain_error(request, exc: DomainError):
    body = {"message": exc.message, "field": exc.field, **exc.details()}
    response = api.create_response(request, body, status=exc.status)
    if exc.retry_after is not None:
        response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return _error(request, 401, "authentication required: a session or an active API token")


@api.exception_handler(PermissionDenied)
def on_denied(request, exc):
    return _error(request, 403, str(exc) or "forbidden")


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return _error(request, 404, str(exc) or "not found")


@api.exception_handler(RequestDataTooBig)
def on_too_big(request, exc):
    # Django's own answer is an HTML 400 page; API clients get JSON naming the limit.
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return _error(request, 413, f"request body too large (limit {limit} bytes)", "body")


@api.exception_handler(NinjaHttpError)
def on_http_error(request, exc: NinjaHttpError):
    return _error(request, exc.status_code, str(exc.message))


@api.exception_handler(DatabaseError)
def on_database_error(request, exc: DatabaseError):
    """The database is down (503, console/outage.py); any other database error stays a 500."""
    from console.outage import DB_ERRORS, unavailable

    if isinstance(exc, DB_ERRORS):
        return unavailable(request)
    raise exc


def _mount_routers() -> None:
    from console.accounts.api import router as accounts_router
    from console.benchmarks.api import router as benchmarks_router
    from console.deployments.api import router as deployments_router
    from console.diagnosis.api import router as diagnosis_router
    from console.gateway.api import router as gateway_router
    from console.inventory.api import router as inventory_router
    from console.logs.api import router as logs_router
    from console.telemetry.api import router as telemetry_router

    api.add_router("/", inventory_router)
    api.add_router("/", telemetry_router)
    api.add_router("/", deployments_router)
    api.add_router("/", diagnosis_router)
    api.add_router("/", logs_router)
    api.add_router("/", benchmarks_router)
    api.add_router("/", gateway_router)
    api.add_router("/", accounts_router)


_mount_routers()
