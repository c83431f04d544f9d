"""REST routes for nodes and accelerators: thin adapters over services."""

from typing import Literal

from django.db.models import Count
from django.db.models.fields.json import KeyTransform
from ninja import Query, Router, Schema, Status
from ninja.pagination import paginate

from console.accounts.models import Role
from console.accounts.services import actor_from_request, check_role
from console.inventory import checks, enrollment, identity, services
from console.inventory.models import (
    Accelerator,
    EnrollmentToken,
    Health,
    Node,
    NodeCheckRun,
    NodeStatus,
)
from console.inventory.schemas import (
    AcceleratorOut,
    CheckRunOut,
    CredentialRevokeIn,
    CredentialsRevokedOut,
    EnrollmentCreatedOut,
    EnrollmentIn,
    EnrollmentOut,
    IsolationIn,
    LabelsIn,
    NodeCredentialOut,
    NodeDetailOut,
    NodeIdentityOut,
    NodeOut,
    NodeStateIn,
    ReleaseIn,
)
from console.pagination import LimitOffsetPagination

router = Router(tags=["inventory"])


class NodeFilters(Schema):
    status: Literal["online", "offline", "draining", "maintenance"] | None = None
    arch: str | None = None
    simulated: bool | None = None
    q: str | None = None
    label: str | None = None  # key=value or key


class AcceleratorFilters(Schema):
    node: str | None = None
    health: Literal["OK", "Warning", "Alarm", "Critical", "UNKNOWN"] | None = None
    model: str | None = None
    isolated: bool | None = None


def filter_nodes(qs, f: NodeFilters):
    if f.status:
        qs = qs.filter(status=NodeStatus(f.status))
    if f.arch:
        qs = qs.filter(arch=f.arch)
    if f.simulated is not None:
        qs = qs.filter(simulated=f.simulated)
    if f.q:
        qs = qs.filter(name__icontains=f.q) | qs.filter(hostname__icontains=f.q)
    if f.label:
        key, _, value = f.label.partition("=")
        qs = qs.filter(labels__has_key=key)
        if value:
            # KeyTransform takes the key verbatim (JSON compare): label keys may contain dots and slashes.
            qs = qs.annotate(_label=KeyTransform(key, "labels")).filter(_label=value)
    return qs


@router.get("/nodes", response=list[NodeOut])
@paginate(LimitOffsetPagination)
def list_nodes(request, filters: Query[NodeFilters]):
    qs = Node.objects.annotate(accelerator_count=Count("accelerators"))
    return filter_nodes(qs, filters).order_by("name")


@router.get("/nodes/{name}", response=NodeDetailOut)
def get_node(request, name: str):
    return services.get_node(name)


@router.put("/nodes/{name}/labels", response=NodeOut)
def set_labels(request, name: str, payload: LabelsIn):
    return services.set_node_labels(
        actor=actor_from_request(request), name=name, labels=payload.labels
    )


@router.post("/nodes/{name}/state", response=NodeOut)
def set_state(request, name: str, payload: NodeStateIn):
    return services.set_node_state(
        actor=actor_from_request(request), name=name, action=payload.action, reason=payload.reason
    )


@router.post("/nodes/{name}/address/accept", response=NodeOut)
def accept_address(request, name: str):
    """Make the node's pending address (a change its agent reported) its address (admin)."""
    return services.accept_node_address(actor=actor_from_request(request), name=name)


@router.get("/accelerators", response=list[AcceleratorOut])
@paginate(LimitOffsetPagination)
def list_accelerators(request, filters: Query[AcceleratorFilters]):
    qs = Accelerator.objects.select_related("node")
    if filters.node:
        qs = qs.filter(node__name=filters.node)
    if filters.health:
        qs = qs.filter(health=Health(filters.health))
    if filters.model:
        qs = qs.filter(model_name__iexact=filters.model)
    if filters.isolated is not None:
        qs = qs.filter(isolated=filters.isolated)
    return qs


@router.get("/accelerators/{accelerator_id}", response=AcceleratorOut)
def get_accelerator(request, accelerator_id: int):
    return services.get_accelerator(accelerator_id)


@router.post("/accelerators/{accelerator_id}/isolate", response=AcceleratorOut)
def isolate(request, accelerator_id: int, payload: IsolationIn):
    return services.set_isolation(
        actor=actor_from_request(request),
        accelerator_id=accelerator_id,
        isolated=True,
        reason=payload.reason,
    )


@router.post("/accelerators/{accelerator_id}/release", response=AcceleratorOut)
def release(request, accelerator_id: int, payload: ReleaseIn):
    return services.set_isolation(
        actor=actor_from_request(request),
        accelerator_id=accelerator_id,
        isolated=False,
        reason=payload.reason,
    )


@router.post("/nodes/{name}/checks", response={202: CheckRunOut})
def run_checks(request, name: str):
    """Ask the node's agent to run its checks now; poll GET …/checks for the answer."""
    return Status(202, checks.request_checks(actor=actor_from_request(request), name=name))


@router.get("/nodes/{name}/checks", response=list[CheckRunOut])
@paginate(LimitOffsetPagination)
def list_checks(request, name: str):
    return NodeCheckRun.objects.filter(node=services.get_node(name)).select_related("node")


@router.get("/enrollment-tokens", response=list[EnrollmentOut])
@paginate(LimitOffsetPagination)
def list_enrollment_tokens(request):
    check_role(actor_from_request(request), Role.ADMIN)
    return EnrollmentToken.objects.all()


@router.post("/enrollment-tokens", response={201: EnrollmentCreatedOut})
def create_enrollment_token(request, payload: EnrollmentIn):
    token, raw = enrollment.create_enrollment_token(
        actor=actor_from_request(request),
        name=payload.name,
        expires_at=payload.expires_at,
        max_uses=payload.max_uses,
        node_pattern=payload.node_pattern,
    )
    token.token = raw
    return Status(201, token)


@router.post("/enrollment-tokens/{token_id}/revoke", response=EnrollmentOut)
def revoke_enrollment_token(request, token_id: int):
    return enrollment.revoke_enrollment_token(actor=actor_from_request(request), token_id=token_id)


# --- node identity (admin): credentials, rotation, revocation, re-enrollment -----------------
def _identity(node: Node) -> dict:
    return {
        "node": node.name,
        "reenroll_allowed": node.reenroll_allowed,
        "credentials": identity.credentials_of(node),
    }


@router.get("/nodes/{name}/credentials", response=NodeIdentityOut)
def list_credentials(request, name: str):
    """The node's credentials (fingerprints, never keys) and whether it may enroll again."""
    check_role(actor_from_request(request), Role.ADMIN)
    return _identity(services.get_node(name))


@router.post("/nodes/{name}/credentials/rotate", response=NodeCredentialOut)
def rotate_credential(request, name: str):
    """Issue a new credential and send it to the agent; the old one stays valid for a grace
    period or until the agent first uses the new one. 409 when none is active."""
    return identity.rotate_credential(actor=actor_from_request(request), name=name)


@router.post("/nodes/{name}/credentials/revoke", response=CredentialsRevokedOut)
def revoke_credential(request, name: str, payload: CredentialRevokeIn):
    """Cut the node off: every active credential is revoked (its messages refused within a
    second). It can enroll again only after POST …/reenroll."""
    actor = actor_from_request(request)
    revoked = identity.revoke_credential(actor=actor, name=name, reason=payload.reason)
    return _identity(services.get_node(name)) | {"revoked": revoked}


@router.post("/nodes/{name}/reenroll", response=NodeIdentityOut)
def allow_reenrollment(request, name: str):
    """Let the node enroll once more with a valid enrollment token (a reinstalled host)."""
    return _identity(identity.allow_reenrollment(actor=actor_from_request(request), name=name))
