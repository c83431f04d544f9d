"""REST routes for diagnosis: thin adapters over services.

POST /diagnose is a read-only computation (nothing is stored), so unlike other writes it is
open to viewers: it authenticates with its own viewer-level session/token checks instead of
the API-wide rule that non-GET methods need the operator role. The body is read here rather
than by ninja so that a log over 5 MB gets a 422 naming "text" whatever Django's
DATA_UPLOAD_MAX_MEMORY_SIZE is.
"""

import asyncio
import json
from datetime import datetime

from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import paginate
from ninja.security import APIKeyCookie, HttpBearer
from pydantic import ValidationError

from console.accounts.models import Role
from console.accounts.services import actor_from_request, authenticate_token, check_role
from console.diagnosis import faultcodes, incidents, services, webhook_services
from console.diagnosis.codes import codebook
from console.diagnosis.models import IncidentStatus, Severity
from console.diagnosis.schemas import DiagnoseIn, DiagnosisOut, FaultLevelOut
from console.errors import Invalid
from console.pagination import LimitOffsetPagination
from console.schemas import StrictIn

router = Router(tags=["diagnosis"])

# JSON escapes can make text up to six times longer (\uXXXX); refuse bodies beyond that.
MAX_BODY_BYTES = services.MAX_TEXT_BYTES * 6 + 64 * 1024


class ViewerTokenAuth(HttpBearer):
    """`Authorization: Bearer npc_…` of a user with at least the viewer role (any scope)."""

    def authenticate(self, request, token):
        api_token = authenticate_token(token)
        if api_token is None:
            return None
        request.user = api_token.user
        request.api_token = api_token
        check_role(actor_from_request(request), Role.VIEWER)
        return api_token


class ViewerSessionAuth(APIKeyCookie):
    """The browser session of a user with at least the viewer role (CSRF-checked)."""

    param_name = "sessionid"

    def authenticate(self, request, key):
        if not request.user.is_authenticated:
            return None
        check_role(actor_from_request(request), Role.VIEWER)
        return request.user


def _too_big() -> Invalid:
    return Invalid("text: the log is larger than 5 MB", field="text")


def _read_payload(request) -> DiagnoseIn:
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > MAX_BODY_BYTES:
        raise _too_big()
    raw = request.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise _too_big()
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise Invalid("body: not valid JSON", field="body") from None
    try:
        return DiagnoseIn.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise Invalid(f"{field}: {first['msg']}", field=field) from None


_BODY_DOC = {
    "x-read-only": True,  # a POST that changes nothing: viewers may call it
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": DiagnoseIn.model_json_schema()}},
    },
}


@router.post(
    "/diagnose",
    response=list[DiagnosisOut],
    auth=[ViewerTokenAuth(), ViewerSessionAuth(csrf=True)],
    openapi_extra=_BODY_DOC,
)
async def diagnose(request):
    """Match a log (≤ 5 MB) plus optional exit code, signal, npu-smi health and telemetry
    against the rule base. Returns the diagnoses best first; [] when nothing is recognised.

    Runs in a thread of its own (not the one every synchronous view shares) and within
    services.TIME_LIMIT_S: a pasted log never holds up the rest of the console."""
    payload = _read_payload(request)
    found = await asyncio.to_thread(
        services.diagnose_text,
        text=payload.text,
        exit_code=payload.exit_code,
        signal=payload.signal,
        health=payload.health,
        telemetry=payload.telemetry,
        time_limit_s=services.TIME_LIMIT_S,
    )
    return [d.as_dict() for d in found]


class CodeSourceOut(Schema):
    title: str
    url: str


class CodeOut(Schema):
    code: str
    kind: str
    kind_title: str
    name: str
    category: str
    meaning: str
    remedy: str
    source: CodeSourceOut
    exact: bool  # False: only the code's class (leading digits) or module (prefix) is known


@router.get("/diagnose/codes/{code}", response=CodeOut)
def error_code(request, code: str):
    """What an Ascend error code means: AscendCL (507035), CANN error-message (EI0006), DCMI
    (-8005) or the driver's (drvErr=87, DRV-87, DRV_ERROR_RESOURCE_OCCUPIED), from the published
    tables with their source. A code missing from the tables but of a known class or module
    gets that class's meaning (`exact`: false)."""
    entry = codebook().lookup(code[:40])
    if entry is None:
        raise Invalid(
            "code: not an Ascend error code the console knows "
            "(e.g. 507035, EI0006, -8005, drvErr=87)",
            field="code",
        )
    return entry.as_dict()


@router.get("/diagnose/fault-codes/{code}", response=FaultLevelOut)
def fault_code(request, code: str):
    """The device-plugin handling level of an Ascend chip fault code (hex, e.g. 80E01801)."""
    try:
        return faultcodes.fault_level(code)
    except ValueError:
        raise Invalid("code: expected 8 hex digits such as 80E01801", field="code") from None


# --- incidents ------------------------------------------------------------------------------
class IncidentOut(Schema):
    id: int
    category: str
    severity: str
    title: str
    status: str
    subject: str
    count: int
    first_seen: datetime
    last_seen: datetime
    replica_id: int | None
    node_id: int | None
    accelerator_id: int | None
    acknowledged_by: str
    acknowledged_at: datetime | None
    resolved_by: str
    resolved_at: datetime | None


class IncidentNoteOut(Schema):
    id: int
    kind: str  # note | system | repeat | action (the incident page's timeline)
    author: str
    text: str
    at: datetime


class IncidentDetailOut(IncidentOut):
    diagnoses: list[dict]
    evidence: list[dict]
    telemetry: dict | None
    notes: list[IncidentNoteOut]


class IncidentNoteIn(StrictIn):
    text: str = Field(min_length=1, max_length=incidents.MAX_NOTE_CHARS)


class IncidentFilters(Schema):
    status: IncidentStatus | None = None
    category: str | None = None


def _detail(incident) -> dict:
    out = IncidentOut.model_validate(incident).model_dump()
    out.update(
        diagnoses=incident.diagnoses,
        evidence=incident.evidence,
        telemetry=incident.telemetry,
        notes=list(incident.notes.all()),
    )
    return out


@router.get("/incidents", response=list[IncidentOut])
@paginate(LimitOffsetPagination)
def list_incidents(request, filters: Query[IncidentFilters]):
    """Incidents: unresolved first, then by severity, then most recently seen."""
    return incidents.incident_queue(status=filters.status or "", category=filters.category or "")


@router.get("/incidents/{incident_id}", response=IncidentDetailOut)
def get_incident(request, incident_id: int):
    return _detail(incidents.get_incident(incident_id))


@router.post("/incidents/{incident_id}/ack", response=IncidentDetailOut)
def ack_incident(request, incident_id: int):
    """open → acknowledged. Operator role."""
    incidents.acknowledge_incident(actor=actor_from_request(request), incident_id=incident_id)
    return _detail(incidents.get_incident(incident_id))


@router.post("/incidents/{incident_id}/note", response={201: IncidentNoteOut})
def note_incident(request, incident_id: int, payload: IncidentNoteIn):
    """Add a note. Operator role."""
    actor = actor_from_request(request)
    note = incidents.add_incident_note(actor=actor, incident_id=incident_id, text=payload.text)
    return Status(201, note)


@router.post("/incidents/{incident_id}/resolve", response=IncidentDetailOut)
def resolve_incident(request, incident_id: int):
    """open/acknowledged → resolved. A recurrence later opens a new incident."""
    incidents.resolve_incident(actor=actor_from_request(request), incident_id=incident_id)
    return _detail(incidents.get_incident(incident_id))


# --- incident webhooks ----------------------------------------------------------------------
# Everyone with the viewer role sees the endpoints masked (url: scheme + host, secret: ***);
# changes need the admin role (checked in console/diagnosis/webhook_services).
class WebhookOut(Schema):
    id: int | None  # None: the read-only INCIDENT_WEBHOOK_URL endpoint
    name: str
    url: str  # scheme and host only
    secret: str  # always "***"
    enabled: bool
    min_severity: str
    renotify_minutes: int
    read_only: bool
    last_delivery_at: datetime | None
    last_status: int | None
    last_error: str
    last_event: str


class WebhookCreatedOut(WebhookOut):
    secret_value: str  # shown this once: the receiver verifies signatures with it


class WebhookIn(StrictIn):
    name: str = Field(min_length=1, max_length=100)
    url: str = Field(min_length=1, max_length=webhook_services.MAX_URL)
    secret: str = Field("", max_length=200, description="empty: one is generated")
    enabled: bool = True
    min_severity: Severity = Severity.WARNING
    renotify_minutes: int = Field(30, ge=0, le=webhook_services.MAX_RENOTIFY_MINUTES)


class WebhookPatch(StrictIn):
    name: str | None = Field(None, min_length=1, max_length=100)
    url: str | None = Field(None, max_length=webhook_services.MAX_URL)
    secret: str | None = Field(None, max_length=200)
    enabled: bool | None = None
    min_severity: Severity | None = None
    renotify_minutes: int | None = Field(None, ge=0, le=webhook_services.MAX_RENOTIFY_MINUTES)


class WebhookTestOut(Schema):
    ok: bool
    status: int | None
    error: str


@router.get("/webhooks", response=list[WebhookOut])
def list_webhooks(request):
    """Incident webhook endpoints, masked; the env endpoint (if set) first, read-only."""
    return webhook_services.shown_endpoints()


@router.post("/webhooks", response={201: WebhookCreatedOut})
def create_webhook(request, payload: WebhookIn):
    """Add an endpoint (admin). 422 on a URL that is not http(s) or is link-local/metadata.
    The secret (given or generated) is returned this once."""
    endpoint = webhook_services.create_endpoint(
        actor=actor_from_request(request), **payload.model_dump()
    )
    return Status(201, {**webhook_services.shown(endpoint), "secret_value": endpoint.secret})


@router.patch("/webhooks/{webhook_id}", response=WebhookOut)
def update_webhook(request, webhook_id: int, payload: WebhookPatch):
    """Change an endpoint (admin); url/secret omitted, empty or as shown keep the stored ones."""
    endpoint = webhook_services.update_endpoint(
        actor=actor_from_request(request),
        endpoint_id=webhook_id,
        **payload.model_dump(exclude_unset=True),
    )
    return webhook_services.shown(endpoint)


@router.delete("/webhooks/{webhook_id}", response={204: None})
def delete_webhook(request, webhook_id: int):
    """Delete an endpoint (admin)."""
    webhook_services.delete_endpoint(actor=actor_from_request(request), endpoint_id=webhook_id)
    return Status(204, None)


@router.post("/webhooks/{webhook_id}/test", response=WebhookTestOut)
def test_webhook(request, webhook_id: int):
    """Deliver a test payload now (admin), waiting at most a few seconds for the receiver."""
    result = webhook_services.send_test(actor=actor_from_request(request), endpoint_id=webhook_id)
    return {"ok": result.ok, "status": result.status, "error": result.error}
