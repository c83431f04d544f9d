"""The host agent: a command loop on its own signed channel plus a heartbeat thread.

`python -m workers agent` runs it. It never touches the console's database. On first start it
exchanges its enrollment token for a node identity (workers/channel.py), kept in
`<state_dir>/identity.json` (0600); from then on it signs every message with that key and runs
only commands the console signed for this node.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import redis
from pydantic import ValidationError

from workers import channel, netprobe
from workers.accelerators import default_providers, hccn, probe_all
from workers.accelerators.base import ProviderResult
from workers.accelerators.process import kill_running_tools
from workers.checks import run_checks
from workers.config import AgentConfig
from workers.contracts import (
    AGENT_VERSION,
    EngineReport,
    EngineSpec,
    Heartbeat,
    NetProbeRequest,
    Tasks,
    describe,
)
from workers.engine.inspect import inspect_model
from workers.engine.shipper import LogShipper
from workers.engine.supervisor import Supervisor

log = logging.getLogger("workers.agent")
NPU_PROVIDERS = ("ascend", "simulated", "nvidia")


def wall_clock() -> float:
    """This host's clock (Unix seconds), as the console's clock-skew check measures it: the
    times in a ping's answer come from here (a test shifts it to play a skewed host)."""
    return time.time()


def primary_address() -> str:
    """The first non-loopback IPv4 address (what operators ssh to), or ''."""
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return addr.address
    return ""


def simulated_node(config: AgentConfig) -> bool:
    """True when this agent's NPUs are the simulated provider's (`--simulated`, `make demo`).
    Its heartbeats then say `simulated` (the console labels the node SIMULATED) and its engines
    are simulated too (workers/engine/simulated.py): a host with real NPUs only never gets
    here, so the real runner is the only one a production host uses."""
    return "simulated" in config.providers


def _degraded(results: list[dict]) -> str | None:
    """Why telemetry is degraded: a configured vendor tool that exists but failed."""
    for r in results:
        reason = r.get("reason") or ""
        if not r["available"] and "not found" not in reason:
            return f"{r['provider']}: {reason}"
    return None


def build_heartbeat(config: AgentConfig, found: dict[str, Any], seq: int) -> Heartbeat:
    """A heartbeat from one probe_all() answer."""
    results = [found[name] for name in NPU_PROVIDERS if name in found]
    chips = [c for r in results if r["available"] for c in r["chips"]]
    processes = [p for r in results if r["available"] for p in r["processes"]]
    # the address the console reaches this host's engines on: the data-plane one when engines
    # are bound to it (NPU_AGENT_ENGINE_HOST), else the first non-loopback IPv4
    wildcard = ("", "0.0.0.0", "::")  # noqa: S104 - compared against, never bound
    address = config.engine_host if config.engine_host not in wildcard else None
    host = dict(found["host"], address=address or primary_address())
    versions = dict(found["versions"])
    versions["npu_smi"] = next((r["version"] for r in results if r["provider"] == "ascend"), None)
    reason = _degraded(results)
    return Heartbeat(
        node=config.node_name,
        sent_at=datetime.now(UTC),
        seq=seq,
        agent_version=AGENT_VERSION,
        interval_s=config.heartbeat_s,
        simulated=simulated_node(config),
        host=host,
        versions=versions,
        chips=chips,
        processes=processes,
        telemetry_ok=reason is None,
        telemetry_reason=reason,
    )


IDENTITY_FILE = "identity.json"
SEEN_COMMANDS_FILE = "commands-seen.json"  # ids of commands run in the last hour (replays)


def identity_path(config: AgentConfig) -> Path:
    return Path(config.state_dir) / IDENTITY_FILE


def enroll(config: AgentConfig, stop: threading.Event) -> channel.Identity | None:
    """This node's identity: the saved one, else exchange the enrollment token for one
    (retried with backoff until it works or the agent stops; a refusal says why)."""
    path = identity_path(config)
    identity = channel.Identity.load(path)
    if identity is not None:
        if identity.node != config.node_name:
            raise SystemExit(
                f"{path} holds the identity of node {identity.node!r}, not {config.node_name!r}"
            )
        return identity
    if not config.enroll_token:
        raise SystemExit(
            "NPU_AGENT_ENROLL_TOKEN is not set and this node has no identity yet "
            f"({path}): create an enrollment token on the console's Enrollment page"
        )
    r = redis.Redis.from_url(channel.redis_url(config.broker_url))
    enrollment = channel.Enrollment(
        node=config.node_name, raw_token=config.enroll_token, agent_version=AGENT_VERSION
    )
    delay = 2.0
    while not stop.is_set():
        try:
            identity = enrollment.attempt(r, wait=30.0)
            identity.save(path)
            log.info("enrolled as %s (credential #%d)", identity.node, identity.kid)
            return identity
        except (channel.Refused, TimeoutError, redis.RedisError) as exc:
            log.warning("enrollment failed: %s; retrying in %.0f s", exc, delay)
        stop.wait(delay)
        delay = min(delay * 2, 60.0)
    return None


def channel_client(config: AgentConfig, identity: channel.Identity) -> redis.Redis:
    """A Redis client as this node: its own ACL user when the console manages Redis ACLs."""
    url = config.broker_url
    if identity.redis_user:
        url = channel.with_credentials(
            url, identity.redis_user, channel.redis_password(identity.key)
        )
    return redis.Redis.from_url(channel.redis_url(url), health_check_interval=30)


class Agent:
    """Holds the long-lived providers and the channel; sends heartbeats and runs commands."""

    def __init__(self, config: AgentConfig, identity: channel.Identity) -> None:
        self.config = config
        self.channel = channel.AgentChannel(
            channel_client(config, identity),
            identity,
            seen_path=Path(config.state_dir) / SEEN_COMMANDS_FILE,
        )
        self.providers = default_providers(config)
        self.stop = threading.Event()
        self._seq = 0
        self.supervisor = Supervisor(
            state_dir=config.state_dir,
            node=config.node_name,
            report=self.send_engine_report,
            python=config.engine_python or sys.executable,
            probe_interval_s=config.engine_probe_s,
            backoff_base_s=config.engine_backoff_s,
            phase_timeouts={
                "starting": config.engine_start_timeout_s,
                "loading": config.engine_start_timeout_s,
            },
            set_env_path=config.cann_set_env,
            engine_host=config.engine_host,
            simulated=simulated_node(config),
        )

    def send(self, kind: str, body: dict) -> None:
        self.channel.send(kind, body)

    def send_engine_report(self, report: EngineReport) -> None:
        self.send(Tasks.ENGINE_REPORT, report.model_dump(mode="json"))

    def beat_once(self) -> Heartbeat:
        found = probe_all(config=self.config, providers=self.providers)
        self._seq += 1
        hb = build_heartbeat(self.config, found, self._seq)
        # log tails travel with the engine's own report on a failure, not in every beat
        hb.engines = [r.model_copy(update={"log_tail": []}) for r in self.supervisor.reports()]
        hb.log_error = self.supervisor.log_error()
        self.send(Tasks.HEARTBEAT, hb.model_dump(mode="json"))
        return hb

    def heartbeat_loop(self) -> None:
        """Beat every interval; after the first beat, run the start-up checks once."""
        checked = False
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.beat_once()
                if not checked:
                    checked = True
                    self.report_checks(None, "agent-start")
            except redis.AuthenticationError:
                log.error("Redis refused this node's credential (revoked?); retrying")
            except Exception:  # noqa: BLE001 - the agent keeps beating whatever fails once
                log.exception("heartbeat failed; retrying next interval")
            self.stop.wait(max(0.0, self.config.heartbeat_s - (time.monotonic() - started)))

    def npu_result(self) -> ProviderResult:
        for provider in self.providers:
            if provider.name in ("ascend", "simulated"):
                return provider.probe()
        return ProviderResult(
            provider="ascend", available=False, reason="no NPU provider configured"
        )

    def report_checks(self, run_id: int | None, trigger: str) -> list[dict]:
        results = [r.model_dump() for r in run_checks(self.config, self.npu_result())]
        report = {
            "node": self.config.node_name,
            "run_id": run_id,
            "trigger": trigger,
            "sent_at": datetime.now(UTC).isoformat(),
            "results": results,
        }
        self.send(Tasks.CHECK_RESULTS, report)
        return results

    def rotate(self, kid: int, wrapped_hex: str) -> None:
        """Take the new credential the console sent wrapped under the current key, save it,
        switch to it and say so (signed with the new key: the console retires the old)."""
        old = self.channel.identity
        key = channel.wrap_key(
            bytes.fromhex(wrapped_hex), int.from_bytes(old.key, "big"), f"rotate:{kid}"
        )
        new = channel.Identity(
            node=old.node, kid=int(kid), key_hex=key.hex(), redis_user=old.redis_user
        )
        new.save(identity_path(self.config))
        self.channel.switch(channel_client(self.config, new), new)
        self.send("console.credential_rotated", {"node": new.node, "kid": new.kid})
        log.info("credential rotated: now #%d", new.kid)


def command_handlers(agent: Agent) -> dict:
    """The commands this agent runs, by name. Each is idempotent."""

    def start_replica(spec: dict) -> None:
        engine = EngineSpec.model_validate(spec)
        if engine.node != agent.config.node_name:
            raise ValueError(f"replica {engine.replica_id} is placed on {engine.node}, not here")
        agent.supervisor.start(engine)

    def model_inspect(path: str, inspection_id: int | None = None) -> dict:
        """Read the model (cached per fingerprint); with an id, answer on the inbox, where
        the console stores it on that inspection's record (nobody waits on a reply key)."""
        result = inspect_model(path)
        if inspection_id is not None:
            report = {"node": agent.config.node_name, "inspection_id": inspection_id}
            agent.send(Tasks.MODEL_INSPECTION, {**report, "path": path, "result": result})
        return result

    def net_probe(probe_id: int, targets: list) -> list[dict]:
        """Reach the peers of a multi-host replica (workers/netprobe.py): validated first
        (IP addresses only, ports in range, at most MAX_PROBE_TARGETS), answered on the
        inbox within about netprobe.BUDGET_S."""
        asked = NetProbeRequest.model_validate({"probe_id": probe_id, "targets": targets})
        results = netprobe.run_probes(asked.targets, tool=hccn.resolve_tool(agent.config.hccn_tool))
        report = {"node": agent.config.node_name, "probe_id": asked.probe_id}
        agent.send(Tasks.NET_PROBE, {**report, "results": results})
        return results

    return {
        Tasks.HOST_NET_PROBE: net_probe,
        Tasks.HOST_RUN_CHECKS: lambda run_id=None: agent.report_checks(run_id, "on-demand"),
        Tasks.HOST_START_REPLICA: start_replica,
        Tasks.HOST_STOP_REPLICA: lambda replica_id, generation=None: agent.supervisor.stop(
            replica_id, generation
        ),
        Tasks.HOST_MODEL_INSPECT: model_inspect,
        Tasks.HOST_LOG_TAIL: lambda replica_id, offset=0, max_bytes=65536: (
            agent.supervisor.log_tail(replica_id, offset, max_bytes)
        ),
        Tasks.HOST_PING: lambda value="": {
            "pong": value,
            "node": agent.config.node_name,
            "agent_version": AGENT_VERSION,
        },  # run_command adds the clock reading (contracts.ClockReading)
        "host.rotate_credential": agent.rotate,
    }


def run_command(agent: Agent, handlers: dict, command: dict) -> None:
    """Run one verified command; answer it when the console waits for an answer."""
    name = command["k"]
    handler = handlers.get(name)
    try:
        if handler is None:
            raise ValueError(f"unknown command {name!r}")
        result = handler(*command["a"])
        if name == Tasks.HOST_PING and isinstance(result, dict):
            # the console's clock-skew check (NTP-style): when this agent read the command
            # (stamped by command_loop, before any wait for a free thread) and answers it
            received = command.get("received_at") or wall_clock()
            result = {**result, "received_at": received, "replied_at": wall_clock()}
        log.info("command %s [%s] done", name, command["id"])
    except ValidationError as exc:  # without the input: a spec carries the engine's key
        log.warning("command %s [%s] refused: %s", name, command["id"], describe(exc))
        result = {"ok": False, "error": describe(exc)[:500]}
    except Exception as exc:  # noqa: BLE001 - one bad command never stops the agent
        log.exception("command %s [%s] failed", name, command["id"])
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    if command.get("r"):
        try:
            agent.channel.reply(command, result)
        except redis.RedisError:
            log.exception("could not answer command %s", name)


def command_loop(agent: Agent, workers: int = 6) -> None:
    """Run the console's commands until the agent stops (a stop may block its thread for the
    grace period: several run at once so the others keep answering)."""
    handlers = command_handlers(agent)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="command") as pool:
        while not agent.stop.is_set():
            try:
                command = agent.channel.next_command(timeout=1.0)
            except redis.RedisError as exc:
                log.warning("command channel: %s; retrying", exc)
                agent.stop.wait(1.0)
                continue
            if command is not None:
                command["received_at"] = wall_clock()
                pool.submit(run_command, agent, handlers, command)


def run(config: AgentConfig) -> int:
    """Run the agent until SIGTERM/SIGINT."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info(  # which vLLM a deployment will get: workers/config.py engine_python_from_env
        "engine python: %s (from %s)",
        config.engine_python or sys.executable,
        config.engine_python_source or "the agent's own interpreter",
    )
    identity = enroll(config, stop)
    if identity is None:
        return 0
    agent = Agent(config, identity)
    agent.stop = stop
    if agent.supervisor.simulated:
        log.warning("NPUs are SIMULATED: engines are simulated too (no vLLM process is started)")
    adopted = agent.supervisor.adopt()  # engines that outlived the previous agent
    if adopted:
        log.info(
            "re-adopted %d engine(s): %s",
            len(adopted),
            ", ".join(str(r.replica_id) for r in adopted),
        )
    threading.Thread(target=agent.heartbeat_loop, name="heartbeat", daemon=True).start()
    shipper = LogShipper(  # log shipping (workers/engine/shipper.py)
        config.state_dir,
        config.node_name,
        lambda batch: agent.send(Tasks.LOG_LINES, batch),
        stop=stop,
    )
    threading.Thread(target=shipper.run, name="log-shipper", daemon=True).start()
    log.info("agent %s %s running", config.node_name, AGENT_VERSION)
    try:
        command_loop(agent)
    finally:
        stop.set()
        agent.supervisor.shutdown()  # stops watching; engines keep running by design
        kill_running_tools()  # a hung npu-smi must not outlive the agent
    return 0
