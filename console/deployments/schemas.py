"""API shapes for deployments and replicas; fields listed explicitly."""

from datetime import datetime
from typing import Literal

from ninja import Field, Schema
from pydantic import ConfigDict

from console.deployments.masking import redact_argv, shown_env, shown_lines
from console.schemas import StrictIn
from workers.engine_settings import EngineSettings

Slug = Field(..., min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class Placement(StrictIn):
    """What a deployment is besides its engine settings: the model, extra flags, placement."""

    name: str = Slug
    model_path: str = Field(
        ..., min_length=1, max_length=500, description="absolute directory on the hosts"
    )
    model_label: str = Field("", max_length=200)
    served_model_name: str = Field(
        ..., min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/-]+$"
    )
    device: Literal["npu", "cpu"] = "npu"
    extra_args: list[str] = Field(default_factory=list, max_length=64)
    extra_env: dict[str, str] = Field(default_factory=dict, max_length=64)
    replicas: int = Field(1, ge=0, le=64)
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=16)
    pinned_node: str | None = Field(None, max_length=63)
    npus_per_replica: int = Field(1, ge=1, le=128, description="all hosts of a replica together")
    nodes_per_replica: int = Field(
        1,
        ge=1,
        le=16,
        description="hosts one replica spans: vLLM multi-node data parallel (DP a multiple of "
        "it; NPUs per replica split evenly); members prefer nodes sharing the "
        "network-domain label",
    )
    preflight_override: str = Field(
        "",
        max_length=500,
        description="multi-host replicas: the reason to start although the NPU-network "
        "preflight fails (docs/operations.md); empty: a failing preflight blocks the start",
    )
    npu_ids: list[int] = Field(default_factory=list, max_length=64)
    reschedule_on_node_loss: bool = False
    cpu_binding: Literal["off", "numa"] = Field(
        "off", description="numa: bind the engine's CPUs and memory to its NPUs' NUMA node(s)"
    )
    desired_state: Literal["running", "stopped"] = "stopped"


class DeploymentIn(EngineSettings, Placement):
    """A whole deployment as the API and the form take it: the engine settings come from the
    one table (workers/engine_settings.py), with its ranges; an unknown field is a 422."""

    model_config = ConfigDict(extra="forbid")

    @property
    def spec(self) -> dict:
        """The fields a deployment stores, without its name, desired state and pinned node."""
        return self.model_dump(exclude={"name", "desired_state", "pinned_node"})


class ScaleIn(StrictIn):
    replicas: int = Field(..., ge=0, le=64)


class CanaryIn(StrictIn):
    percent: int = Field(
        ...,
        ge=0,
        le=99,
        description="share of requests the first replacement of a rolling update takes "
        "until promoted (0: no canary)",
    )


class AutoscalerIn(StrictIn):
    """Autoscaling bounds and targets (console/deployments/autoscale.py)."""

    min_replicas: int = Field(..., ge=1, le=64)
    max_replicas: int = Field(..., ge=1, le=64)
    waiting_target: float = Field(
        2.0, gt=0, le=10_000, description="waiting requests per ready replica, sustained"
    )
    kv_target: float = Field(80.0, gt=0, le=100, description="KV-cache usage %, sustained")
    window_s: int = Field(60, ge=15, le=3600, description="how long load must last to add")
    cooldown_s: int = Field(300, ge=30, le=86_400, description="idle this long to remove one")


class ScalingEventOut(Schema):
    at: datetime
    action: str
    from_replicas: int
    to_replicas: int
    reason: str
    numbers: dict


class AutoscalerOut(Schema):
    min_replicas: int
    max_replicas: int
    waiting_target: float
    kv_target: float
    window_s: int
    cooldown_s: int
    status: str
    changed_at: datetime | None
    replicas: int
    events: list[ScalingEventOut]

    @staticmethod
    def resolve_replicas(obj) -> int:
        return obj.deployment.replicas

    @staticmethod
    def resolve_events(obj) -> list:
        return list(obj.deployment.scaling_events.all()[:20])


class ReplicaEventOut(Schema):
    at: datetime
    from_state: str
    to_state: str
    reason: str
    generation: int


class ReplicaOut(Schema):
    id: int
    deployment: str = Field(..., alias="deployment.name")
    index: int
    node: str | None
    npu_ids: list[int]
    port: int | None
    pid: int | None
    generation: int
    state: str
    state_reason: str
    state_changed_at: datetime
    restarts: int
    exit_code: int | None

    @staticmethod
    def resolve_node(obj) -> str | None:
        return obj.node.name if obj.node_id else None

    @staticmethod
    def resolve_npu_ids(obj) -> list[int]:
        return obj.npu_list


class ReplicaDetailOut(ReplicaOut):
    events: list[ReplicaEventOut]
    log_tail: list[str]
    metrics: dict

    @staticmethod
    def resolve_events(obj) -> list:
        return list(obj.events.all())

    @staticmethod
    def resolve_log_tail(obj) -> list[str]:
        return shown_lines(obj.log_tail)

    @staticmethod
    def resolve_metrics(obj) -> dict:
        from console.deployments.engines import engine_metrics

        return engine_metrics([obj.pk]).get(obj.pk, {})


class RolloutOut(Schema):
    """The deployment's latest rolling update (console/deployments/rollout.py)."""

    state: str  # rolling, rolling-back, done, rolled-back, failed, superseded
    from_version: int = Field(..., description="the last good spec: what a rollback restores")
    to_version: int = Field(..., description="the spec being rolled out")
    target_version: int = Field(..., description="what replicas converge to now")
    replaced: int
    step_mode: str = Field(..., description="surge, in-place or empty between steps")
    reason: str
    summary: str
    canary_percent: int = Field(..., description="the share its canary takes (0: none)")
    canary_held: bool = Field(..., description="paused at its canary: promote or roll back")
    promoted_at: datetime | None
    started_at: datetime
    finished_at: datetime | None


class DeploymentOut(Schema, EngineSettings):
    id: int
    name: str
    model_path: str
    model_label: str
    served_model_name: str
    device: str
    extra_args: list[str]
    extra_env: dict[str, str]
    replicas: int
    canary_percent: int
    node_selector: dict[str, str]
    pinned_node: str | None
    npus_per_replica: int
    nodes_per_replica: int
    preflight_override: str
    npu_ids: list[int]
    reschedule_on_node_loss: bool
    cpu_binding: str
    desired_state: str
    spec_version: int
    model_info: dict
    estimate: dict
    ready_replicas: int
    created_at: datetime
    rollout: RolloutOut | None = None

    @staticmethod
    def resolve_pinned_node(obj) -> str | None:
        return obj.pinned_node.name if obj.pinned_node_id else None

    @staticmethod
    def resolve_extra_args(obj) -> list[str]:
        """Secret flags' values `***` (a PUT that sends them back keeps the stored ones)."""
        return redact_argv(list(obj.extra_args or []))

    @staticmethod
    def resolve_extra_env(obj) -> dict:
        """Secret-named values `***`, URL passwords hidden (kept by a PUT, as extra_args)."""
        return shown_env(obj.extra_env or {})

    @staticmethod
    def resolve_ready_replicas(obj) -> int:
        return sum(1 for r in obj.replica_set.all() if r.state == "ready")

    @staticmethod
    def resolve_rollout(obj) -> dict | None:
        from console.deployments.rollout import summary

        if "rollouts" in getattr(obj, "_prefetched_objects_cache", {}):
            latest = obj.rollouts.all()  # the list prefetched them, newest first
            ro = latest[0] if latest else None
        else:
            ro = obj.rollouts.first()
        if ro is None:
            return None
        fields = ("state", "from_version", "to_version", "target_version", "replaced")
        fields += ("canary_percent", "canary_held", "promoted_at")
        return {k: getattr(ro, k) for k in fields} | {
            "step_mode": ro.step_mode,
            "reason": ro.reason,
            "summary": summary(ro, obj.replicas),
            "started_at": ro.started_at,
            "finished_at": ro.finished_at,
        }


class CatalogCardOut(Schema):
    id: str
    label: str
    family: str
    memory_mb: int
    memory_kind: str
    npus_per_node: int
    dtypes: list[str]
    source: str


class CatalogPresetOut(Schema):
    card: str
    fits: bool
    blocked_by: str | None
    why: str
    support: str | None
    note: str
    nodes: int | None = Field(None, description="hosts one replica spans (nodes_per_replica)")
    npus: int | None = Field(None, description="the replica's NPUs, all hosts together")
    tensor_parallel_size: int | None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    layout: str = ""
    hosts_note: str = Field("", description="what a replica over several hosts needs")
    dtype: str | None
    quantization: str | None
    max_model_len: int | None
    gpu_memory_utilization: float | None
    enforce_eager: bool | None
    extra_args: list[str]
    spec: dict | None = Field(None, description="deployment fields to POST to /deployments")
    estimate: dict | None = Field(None, description="the console's memory estimate on this card")


class CatalogModelOut(Schema):
    id: str
    hub_id: str
    family: str
    architecture: str
    attention: str
    parameters: int
    active_parameters: int | None
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    max_position_embeddings: int
    torch_dtype: str
    presets: list[CatalogPresetOut]


class CatalogOut(Schema):
    cards: list[CatalogCardOut]
    models: list[CatalogModelOut]


class ModelInspectionOut(Schema):
    """One model inspection: pending until the node's agent answers (poll this)."""

    id: int
    node: str = Field(..., alias="node.name")
    path: str
    status: str  # pending, done, failed
    fingerprint: str
    mtime: datetime | None
    info: dict
    error: str
    requested_at: datetime
    answered_at: datetime | None
