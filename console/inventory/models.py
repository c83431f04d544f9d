"""Nodes (Ascend hosts) and their accelerators (NPU chips)."""

from __future__ import annotations

import re

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class AgentSkew(models.TextChoices):
    """How a node's agent version stands against the console's (docs/operations.md, Upgrades).

    Console X.Y supports agents X.Y (any patch) and X.(Y-1). An agent newer than the console,
    of another major version, or older than one minor version is unsupported: upgrade the
    console first, then the agents, one minor version at a time."""

    CURRENT = "current", "same version"
    BEHIND = "behind", "one minor version behind (supported)"
    UNSUPPORTED = "unsupported", "unsupported version"
    UNKNOWN = "unknown", "not reported"


def _major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"^v?(\d+)\.(\d+)(?:[.+\-]|$)", version.strip())
    return (int(match[1]), int(match[2])) if match else None


def agent_skew(agent_version: str, console_version: str) -> AgentSkew:
    """Where `agent_version` stands in the skew policy of `console_version` (pure)."""
    if not agent_version.strip():
        return AgentSkew.UNKNOWN
    agent, console = _major_minor(agent_version), _major_minor(console_version)
    if agent is None or console is None or agent[0] != console[0]:
        return AgentSkew.UNSUPPORTED
    if agent[1] == console[1]:
        return AgentSkew.CURRENT
    return AgentSkew.BEHIND if agent[1] == console[1] - 1 else AgentSkew.UNSUPPORTED


class NodeStatus(models.TextChoices):
    ONLINE = "online", "Online"
    OFFLINE = "offline", "Offline"
    DRAINING = "draining", "Draining"
    MAINTENANCE = "maintenance", "Maintenance"


class AdminState(models.TextChoices):
    """What an operator asked for; `status` shows it while the node is reachable."""

    ACTIVE = "active", "Active"
    DRAINING = "draining", "Draining"
    MAINTENANCE = "maintenance", "Maintenance"


# The one table of allowed status transitions (from -> allowed targets).
NODE_TRANSITIONS: dict[str, set[str]] = {
    NodeStatus.ONLINE: {NodeStatus.OFFLINE, NodeStatus.DRAINING, NodeStatus.MAINTENANCE},
    NodeStatus.DRAINING: {NodeStatus.ONLINE, NodeStatus.OFFLINE, NodeStatus.MAINTENANCE},
    NodeStatus.MAINTENANCE: {NodeStatus.ONLINE, NodeStatus.OFFLINE, NodeStatus.DRAINING},
    NodeStatus.OFFLINE: {NodeStatus.ONLINE, NodeStatus.DRAINING, NodeStatus.MAINTENANCE},
}


class Node(models.Model):
    """An Ascend (or other) host running a host agent. Kunpeng 920 hosts are aarch64."""

    name = models.SlugField(max_length=63, unique=True, help_text="agent queue is host.<name>")
    hostname = models.CharField(max_length=253)
    address = models.CharField(max_length=253, blank=True, help_text="an IP address, or empty")
    pending_address = models.CharField(
        max_length=253,
        blank=True,
        help_text="a changed address the agent reports; an admin accepts it",
    )
    arch = models.CharField(max_length=32, blank=True, help_text="uname -m: aarch64, x86_64…")
    cpu_model = models.CharField(max_length=200, blank=True)
    cpu_cores = models.PositiveIntegerField(null=True, blank=True)
    memory_mb = models.PositiveBigIntegerField(null=True, blank=True)
    os = models.CharField(max_length=200, blank=True)
    kernel = models.CharField(max_length=100, blank=True)
    npu_driver_version = models.CharField(max_length=64, blank=True)
    npu_firmware_version = models.CharField(max_length=64, blank=True)
    cann_version = models.CharField(max_length=64, blank=True)
    npu_smi_version = models.CharField(max_length=64, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.OFFLINE)
    admin_state = models.CharField(
        max_length=16, choices=AdminState.choices, default=AdminState.ACTIVE
    )
    status_reason = models.CharField(max_length=300, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    simulated = models.BooleanField(
        default=False, help_text="telemetry replayed from captured samples"
    )
    software = models.JSONField(
        default=dict, blank=True, help_text="vllm, vllm-ascend, torch, torch-npu…"
    )
    numa_nodes = models.JSONField(
        default=list,
        blank=True,
        help_text='the host\'s NUMA layout: [{"node": 0, "cpus": "0-23", "memory_mb": 128000}]',
    )
    interfaces = models.JSONField(
        default=dict,
        blank=True,
        help_text='network interfaces and their IPs: {"enp189s0f0": ["10.0.0.2"]} '
        "(a multi-host replica picks HCCL/Gloo's interface from it)",
    )
    telemetry_ok = models.BooleanField(default=True)
    telemetry_reason = models.CharField(
        max_length=300, blank=True, help_text="why telemetry is degraded"
    )
    log_error = models.CharField(
        max_length=300, blank=True, help_text="why engine logs cannot be written (disk full)"
    )
    enrolled_with = models.ForeignKey(
        "EnrollmentToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="nodes"
    )
    reenroll_allowed = models.BooleanField(
        default=False, help_text="an admin let this node name enroll again (once)"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]
        # (status, simulated): the dashboard counts the fleet by both from this index alone
        indexes = [models.Index(fields=["status", "simulated"])]

    def __str__(self) -> str:
        return self.name

    @property
    def queue(self) -> str:
        return f"host.{self.name}"

    @property
    def schedulable(self) -> bool:
        return self.status == NodeStatus.ONLINE

    @property
    def numa_node_ids(self) -> set[int]:
        """The NUMA nodes the agent reported for this host (empty: not reported)."""
        return {n["node"] for n in self.numa_nodes or [] if isinstance(n.get("node"), int)}

    @property
    def agent_skew(self) -> AgentSkew:
        """This node's agent version against the running console's (see AgentSkew)."""
        from console import __version__

        return agent_skew(self.agent_version, __version__)


class Health(models.TextChoices):
    """npu-smi health words; the most severe wins. UNKNOWN = absent or not started."""

    OK = "OK", "OK"
    WARNING = "Warning", "Warning"
    ALARM = "Alarm", "Alarm"
    CRITICAL = "Critical", "Critical"
    UNKNOWN = "UNKNOWN", "Unknown"


class Accelerator(models.Model):
    """One NPU chip (a die): 910B cards have one per NPU id, 300I Duo and A3 have two."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="accelerators")
    npu_id = models.PositiveIntegerField(
        help_text="npu-smi NPU id (not contiguous, not /dev index)"
    )
    chip_id = models.PositiveIntegerField(default=0)
    logic_id = models.PositiveIntegerField(
        null=True, blank=True, help_text="ASCEND_RT_VISIBLE_DEVICES id"
    )
    phy_id = models.PositiveIntegerField(null=True, blank=True)
    vendor = models.CharField(max_length=32, default="huawei")
    model_name = models.CharField(max_length=64, blank=True, help_text="910B3, 310P3, Ascend910…")
    hbm_total_mb = models.PositiveIntegerField(null=True, blank=True)
    memory_total_mb = models.PositiveIntegerField(null=True, blank=True)
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    bus_id = models.CharField(max_length=32, blank=True)
    numa_node = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="the NUMA node it is attached to, as the agent read it"
    )
    serial = models.CharField(max_length=64, blank=True)
    die_id = models.CharField(max_length=128, blank=True)
    isolated = models.BooleanField(default=False)
    isolation_reason = models.CharField(max_length=300, blank=True)
    isolated_at = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node__name", "npu_id", "chip_id"]
        # the dashboard counts the fleet's NPUs by health and isolation from this index alone
        indexes = [models.Index(fields=["health", "isolated"])]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "npu_id", "chip_id"], name="uniq_chip_per_node"
            ),
            models.CheckConstraint(
                condition=Q(isolated=False) | ~Q(isolation_reason=""), name="isolation_has_reason"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/npu{self.npu_id}.{self.chip_id}"

    @property
    def healthy(self) -> bool:
        return self.health == Health.OK


class EnrollmentToken(models.Model):
    """A bootstrap token: exchanged once by an agent for its node's own credential
    (NodeCredential). Only the hash is stored; the value is shown once and never travels:
    the agent proves it holds it (docs/security.md). May be single-use (`max_uses`), limited
    to node names matching `node_pattern` (a shell glob), and expire."""

    name = models.CharField(max_length=100)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    hint = models.CharField(max_length=12, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    max_uses = models.PositiveIntegerField(
        null=True, blank=True, help_text="enrollments allowed; empty = unlimited, 1 = single-use"
    )
    uses = models.PositiveIntegerField(default=0)
    node_pattern = models.CharField(
        max_length=100, blank=True, help_text="node names it may enroll (glob, e.g. rack-b-*)"
    )

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}…)"

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class NodeCredential(models.Model):
    """A node's own identity, issued at enrollment or rotation. The key is derived from the
    console's secret and (node, id), never stored: the database holds its fingerprint only.

    A message is accepted when it is signed with the key of an active credential of the node
    it names; a superseded credential stays valid until `grace_until` (rotation in flight)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="credentials")
    fingerprint = models.CharField(max_length=32)
    issued_at = models.DateTimeField(default=timezone.now)
    issued_via = models.CharField(max_length=150, blank=True)  # "token rack-b", "rotation by ada"
    token = models.ForeignKey(  # the enrollment token it was issued for, if any
        EnrollmentToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    request_id = models.CharField(max_length=64, blank=True)  # the enrollment request's rid
    last_used_at = models.DateTimeField(null=True, blank=True)
    grace_until = models.DateTimeField(null=True, blank=True)  # superseded, valid until then
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-issued_at"]
        indexes = [models.Index(fields=["node", "revoked_at"])]

    def __str__(self) -> str:
        return f"{self.node.name} #{self.pk} {self.fingerprint}"

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.revoked_at is None and (self.grace_until is None or self.grace_until > now)


class CheckRunStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
    TIMEOUT = "timeout", "No answer"


class NodeCheckRun(models.Model):
    """One run of the node checks: who asked, when, and each check's result and fix."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="check_runs")
    trigger = models.CharField(max_length=16, default="on-demand")  # on-demand, agent-start
    requested_by = models.CharField(max_length=150, blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=CheckRunStatus.choices, default=CheckRunStatus.PENDING
    )
    results = models.JSONField(default=list, blank=True)  # [{name, ok, evidence, fix}]

    class Meta:
        ordering = ["-requested_at"]
        indexes = [models.Index(fields=["node", "-requested_at"])]

    def __str__(self) -> str:
        return f"checks {self.node.name} {self.requested_at:%Y-%m-%d %H:%M:%S} {self.status}"
