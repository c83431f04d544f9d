"""The host agent: a Celery worker on queue host.<node> plus a heartbeat thread.

`python -m workers agent` runs it. It never touches the console's database: it sends
heartbeats and check results as tasks on queue `console`, and consumes its own queue.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psutil

from workers.accelerators import default_providers, probe_all
from workers.accelerators.base import ProviderResult
from workers.accelerators.process import kill_running_tools
from workers.celery import make_app, send_to_console
from workers.checks import run_checks
from workers.config import AgentConfig
from workers.contracts import AGENT_VERSION, EngineReport, EngineSpec, Heartbeat, Tasks, host_queue
from workers.engine.inspect import inspect_model
from workers.engine.shipper import LogShipper
from workers.engine.supervisor import Supervisor

log = logging.getLogger("workers.agent")
NPU_PROVIDERS = ("ascend", "simulated", "nvidia")


def primary_address() -> str:
    """The first non-loopback IPv4 address (what operators ssh to), or ''."""
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family == socket.AF_INET and not addr.address.startswith("127."):
                return addr.address
    return ""


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
    host = dict(found["host"], address=primary_address())
    versions = dict(found["versions"])
    versions["npu_smi"] = next((r["version"] for r in results if r["provider"] == "ascend"), None)
    reason = _degraded(results)
    return Heartbeat(
        node=config.node_name,
        enroll_token=config.enroll_token,
        sent_at=datetime.now(UTC),
        seq=seq,
        agent_version=AGENT_VERSION,
        interval_s=config.heartbeat_s,
        simulated="simulated" in config.providers,
        host=host,
        versions=versions,
        chips=chips,
        processes=processes,
        telemetry_ok=reason is None,
        telemetry_reason=reason,
    )


class Agent:
    """Holds the long-lived providers; sends heartbeats and runs checks."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.app = make_app(config)
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
        )

    def send_engine_report(self, report: EngineReport) -> None:
        send_to_console(self.app, Tasks.ENGINE_REPORT, report.model_dump(mode="json"))

    def beat_once(self) -> Heartbeat:
        found = probe_all(config=self.config, providers=self.providers)
        self._seq += 1
        hb = build_heartbeat(self.config, found, self._seq)
        hb.engines = [r.model_dump(mode="json") for r in self.supervisor.reports()]
        hb.log_error = self.supervisor.log_error()
        send_to_console(self.app, Tasks.HEARTBEAT, hb.model_dump(mode="json"))
        return hb

    def heartbeat_loop(self) -> None:
        """Beat every interval; after the first beat (which registers the node), run the
        start-up checks once."""
        checked = False
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.beat_once()
                if not checked:
                    checked = True
                    self.report_checks(None, "agent-start")
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
        send_to_console(self.app, Tasks.CHECK_RESULTS, report)
        return results


def register_tasks(agent: Agent) -> None:
    @agent.app.task(name=Tasks.HOST_RUN_CHECKS, ignore_result=True)
    def run_checks_task(run_id: int | None = None) -> None:
        """Run the node checks and report them (idempotent: reports are keyed by run id)."""
        agent.report_checks(run_id, "on-demand")

    @agent.app.task(name=Tasks.HOST_START_REPLICA, ignore_result=True, acks_late=True)
    def start_replica(spec: dict) -> None:
        """Run a replica's engine. Idempotent per (replica id, generation): acks_late is safe."""
        agent.supervisor.start(EngineSpec.model_validate(spec))

    @agent.app.task(name=Tasks.HOST_STOP_REPLICA, ignore_result=True, acks_late=True)
    def stop_replica(replica_id: int, generation: int | None = None) -> None:
        """Stop a replica's engine and free its port. Idempotent."""
        agent.supervisor.stop(replica_id, generation)

    @agent.app.task(name=Tasks.HOST_MODEL_INSPECT)
    def model_inspect(path: str) -> dict:
        """Read a model directory's config.json and weights (no side effects)."""
        return inspect_model(path)

    @agent.app.task(name=Tasks.HOST_LOG_TAIL)
    def log_tail(replica_id: int, offset: int = 0, max_bytes: int = 65536) -> dict:
        return agent.supervisor.log_tail(replica_id, offset, max_bytes)

    @agent.app.task(name=Tasks.HOST_PING)
    def ping(value: str = "") -> dict:
        return {"pong": value, "node": agent.config.node_name, "agent_version": AGENT_VERSION}


def run(config: AgentConfig) -> int:
    """Run the agent until SIGTERM/SIGINT (Celery's warm shutdown)."""
    if not config.enroll_token:
        log.warning(
            "NPU_AGENT_ENROLL_TOKEN is not set: the console will refuse this node's heartbeats"
        )
    agent = Agent(config)
    register_tasks(agent)
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
        lambda batch: send_to_console(agent.app, Tasks.LOG_LINES, batch),
        stop=agent.stop,
    )
    threading.Thread(target=shipper.run, name="log-shipper", daemon=True).start()
    argv = [
        "worker",
        "-Q",
        host_queue(config.node_name),
        "-n",
        f"agent@{config.node_name}",
        "--concurrency",
        "6",  # a stop may block its thread for the grace period; keep others answering
        "-P",
        "threads",
        "-l",
        "info",
        "--without-gossip",
        "--without-mingle",
    ]
    try:
        agent.app.worker_main(argv)
    finally:
        agent.stop.set()
        agent.supervisor.shutdown()  # stops watching; engines keep running by design
        kill_running_tools()  # a hung npu-smi must not outlive the agent
    return 0
