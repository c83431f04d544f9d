"""API shapes for nodes and accelerators; fields listed explicitly."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Field, Schema

from console.schemas import StrictIn, UtcDatetime


class AcceleratorOut(Schema):
    id: int
    node: str = Field(..., alias="node.name")
    npu_id: int
    chip_id: int
    logic_id: int | None
    phy_id: int | None
    vendor: str
    model_name: str
    hbm_total_mb: int | None
    memory_total_mb: int | None
    health: str
    bus_id: str
    numa_node: int | None = Field(
        ..., description="the NUMA node the chip is attached to (sysfs or npu-smi -t topo)"
    )
    serial: str
    die_id: str
    isolated: bool
    isolation_reason: str
    isolated_at: datetime | None
    last_seen: datetime | None


class NumaNodeOut(Schema):
    node: int
    cpus: str = Field(..., description="kernel CPU list, e.g. 0-23,96-119")
    memory_mb: int | None


class NodeOut(Schema):
    id: int
    name: str
    hostname: str
    address: str
    pending_address: str = Field(..., description="a changed address waiting for an admin")
    arch: str
    cpu_model: str
    cpu_cores: int | None
    memory_mb: int | None
    os: str
    npu_driver_version: str
    npu_firmware_version: str
    cann_version: str
    labels: dict[str, str]
    status: str
    admin_state: str
    status_reason: str
    last_heartbeat: datetime | None
    agent_version: str
    agent_skew: str = Field(
        ..., description="current | behind (supported, upgrade) | unsupported | unknown"
    )
    simulated: bool
    telemetry_ok: bool
    telemetry_reason: str
    log_error: str
    accelerator_count: int
    numa_nodes: list[NumaNodeOut] = Field(..., description="the host's NUMA layout")

    @staticmethod
    def resolve_accelerator_count(obj) -> int:
        annotated = getattr(obj, "accelerator_count", None)
        return annotated if annotated is not None else obj.accelerators.count()


class NodeDetailOut(NodeOut):
    accelerators: list[AcceleratorOut]

    @staticmethod
    def resolve_accelerators(obj) -> list:
        return list(obj.accelerators.select_related("node"))


class LabelsIn(StrictIn):
    labels: dict[str, str] = Field(..., description="replaces all labels; {} clears them")


class NodeStateIn(StrictIn):
    action: Literal["drain", "maintenance", "activate"]
    reason: str = Field("", max_length=300)


class IsolationIn(StrictIn):
    reason: str = Field(..., min_length=1, max_length=300)


class ReleaseIn(StrictIn):
    reason: str = Field(..., min_length=1, max_length=300, description="why it is safe again")


class EnrollmentIn(StrictIn):
    name: str = Field(..., min_length=1, max_length=100)
    expires_at: UtcDatetime | None = None
    max_uses: int | None = Field(None, description="enrollments allowed; 1 = single use")
    node_pattern: str = Field("", description="node names it may enroll, a glob: rack-b-*")


class EnrollmentOut(Schema):
    id: int
    name: str
    hint: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    max_uses: int | None = Field(..., description="enrollments allowed; null = unlimited")
    uses: int = Field(..., description="nodes enrolled with it so far")
    node_pattern: str = Field(..., description="node names it may enroll (glob); empty = any")
    nodes: int

    @staticmethod
    def resolve_nodes(obj) -> int:
        return obj.nodes.count()


class EnrollmentCreatedOut(EnrollmentOut):
    token: str = Field(..., description="give it to agents as NPU_AGENT_ENROLL_TOKEN; shown once")


class NodeCredentialOut(Schema):
    """A node credential's public fields: the key itself is never stored nor returned."""

    id: int
    fingerprint: str
    issued_at: datetime
    issued_via: str
    last_used_at: datetime | None
    grace_until: datetime | None = Field(..., description="superseded: valid until then")
    revoked_at: datetime | None
    revoked_reason: str
    active: bool

    @staticmethod
    def resolve_active(obj) -> bool:
        return obj["active"] if isinstance(obj, dict) else obj.is_active()


class NodeIdentityOut(Schema):
    node: str
    reenroll_allowed: bool = Field(..., description="may enroll again once (an admin allowed)")
    credentials: list[NodeCredentialOut]


class CredentialsRevokedOut(NodeIdentityOut):
    revoked: int = Field(..., description="how many active credentials were revoked")


class CredentialRevokeIn(StrictIn):
    reason: str = Field(..., min_length=1, max_length=300, description="why; kept in the audit log")


class CheckResultOut(Schema):
    name: str
    ok: bool
    evidence: str
    fix: str


class CheckRunOut(Schema):
    id: int
    node: str = Field(..., alias="node.name")
    trigger: str
    requested_by: str
    requested_at: datetime
    finished_at: datetime | None
    status: str
    results: list[CheckResultOut]
