"""host.net_probe on the agent (workers/netprobe.py): NPU pings through hccn_tool (fed real
published outputs), the DP RPC port checked with real sockets (refused = the host answers)
and a dropped path simulated by a connect that times out; the contract's caps."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.workers.hccn_support import fixture
from tests.workers.test_agent import make_agent
from workers import netprobe
from workers.accelerators import hccn
from workers.accelerators.process import ToolRun
from workers.agent import command_handlers
from workers.contracts import (
    MAX_PROBE_TARGETS,
    NetProbeReport,
    NetProbeRequest,
    ProbeTarget,
    Tasks,
)


@pytest.fixture(scope="session", autouse=True)
def redis_url() -> None:
    return None


class FakePing:
    """hccn_tool answering -ping / -hccs_ping with a real output per address."""

    def __init__(self, by_address: dict[str, str]) -> None:
        self.by_address, self.calls = by_address, []

    def __call__(self, argv, timeout):
        self.calls.append((list(argv), timeout))
        return ToolRun(" ".join(argv), 0, self.by_address[argv[-1]])


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def targets(*items: dict) -> list[ProbeTarget]:
    return [ProbeTarget.model_validate(t) for t in items]


def test_npu_pings_run_hccn_tool_per_target_and_read_its_output() -> None:
    ok, lost = fixture("ping-ok-mindie-doc.txt"), fixture("ping-loss-mindie-doc.txt")
    runner = FakePing({"10.20.2.10": ok, "10.20.2.11": lost})
    found = netprobe.run_probes(
        targets(
            {"kind": "npu-ping", "npu": 0, "address": "10.20.2.10"},
            {"kind": "npu-ping", "npu": 1, "address": "10.20.2.11", "hccs": True},
        ),
        tool="/usr/local/Ascend/driver/tools/hccn_tool",
        runner=runner,
    )
    assert [r["ok"] for r in found] == [True, False]
    assert found[1]["detail"].startswith("NPU 1 -hccs_ping 10.20.2.11: 2/3 replies")
    argvs = sorted(argv for argv, _ in runner.calls)
    assert argvs[0][1:] == ["-i", "0", "-ping", "-g", "address", "10.20.2.10"]
    assert argvs[1][1:] == ["-i", "1", "-hccs_ping", "-g", "address", "10.20.2.11"]
    assert all(t <= netprobe.PING_TIMEOUT_S for _, t in runner.calls)


def test_without_hccn_tool_a_ping_fails_saying_so() -> None:
    found = netprobe.run_probes(
        targets({"kind": "npu-ping", "npu": 0, "address": "10.20.2.10"}), tool=None
    )
    assert found[0]["ok"] is False and found[0]["detail"] == hccn.NO_TOOL


def test_a_refused_port_is_reachable_and_an_open_one_too() -> None:
    port = closed_port()
    ok, detail = netprobe.port_reachable("127.0.0.1", port)
    assert ok and "refused the connection" in detail and "nothing drops it" in detail
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        ok, detail = netprobe.port_reachable("127.0.0.1", server.getsockname()[1])
    assert ok and "open" in detail


def test_a_dropped_path_times_out_and_fails() -> None:
    asked = []

    def dropped(address, timeout):
        asked.append((address, timeout))
        raise TimeoutError("timed out")

    found = netprobe.run_probes(
        targets({"kind": "port", "address": "10.0.1.1", "port": 40000}),
        tool=None,
        connect=dropped,
        connect_timeout_s=0.2,
    )
    assert found[0]["ok"] is False and "no answer within 0.2s" in found[0]["detail"]
    assert "firewall drops" in found[0]["detail"] and asked == [(("10.0.1.1", 40000), 0.2)]


def test_an_unreachable_network_fails_naming_the_error() -> None:
    def unreachable(address, timeout):
        raise OSError(101, "Network is unreachable")

    ok, detail = netprobe.port_reachable("10.0.1.1", 1, connect=unreachable)
    assert not ok and "Network is unreachable (ENETUNREACH)" in detail


def test_the_whole_answer_is_bounded_by_the_budget() -> None:
    def slow(argv, timeout):
        time.sleep(min(timeout, 0.3))
        return ToolRun(" ".join(argv), None, "", "", error=f"timed out after {timeout:g}s")

    many = [{"kind": "npu-ping", "npu": i % 16, "address": f"10.20.2.{i}"} for i in range(40)]
    started = time.monotonic()
    found = netprobe.run_probes(targets(*many), tool="hccn_tool", runner=slow, budget_s=0.8)
    took = time.monotonic() - started
    assert len(found) == 40 and not any(r["ok"] for r in found)
    assert took < 2.0, took
    assert any("budget was spent" in r["detail"] for r in found)


def test_the_agent_runs_the_command_and_answers_on_the_inbox(tmp_path: Path, monkeypatch) -> None:
    agent, _ = make_agent(tmp_path)
    out = []
    agent.send = lambda kind, body: out.append((kind, body))
    monkeypatch.setattr(hccn, "resolve_tool", lambda configured: None)
    port = closed_port()
    handlers = command_handlers(agent)
    asked = [
        {"kind": "npu-ping", "npu": 3, "address": "10.20.2.13"},
        {"kind": "port", "address": "127.0.0.1", "port": port},
    ]
    handlers[Tasks.HOST_NET_PROBE](7, asked)
    ((kind, body),) = out
    report = NetProbeReport.model_validate(body)
    assert kind == Tasks.NET_PROBE and report.probe_id == 7 and report.node == "node-1"
    assert [(r.kind, r.ok) for r in report.results] == [("npu-ping", False), ("port", True)]
    with pytest.raises(ValidationError):  # a name is never resolved, an option never run
        handlers[Tasks.HOST_NET_PROBE](8, [{"kind": "port", "address": "db.local", "port": 1}])
    assert len(out) == 1


@pytest.mark.parametrize(
    "target",
    [
        {"kind": "npu-ping", "npu": 0, "address": "-h"},
        {"kind": "npu-ping", "npu": 0, "address": "peer.example"},
        {"kind": "npu-ping", "npu": 0, "address": "10.0.0.1; reboot"},
        {"kind": "port", "address": "fe80::1%eth0", "port": 22},
        {"kind": "port", "address": "10.0.0.1", "port": 0},
        {"kind": "port", "address": "10.0.0.1", "port": 65536},
        {"kind": "port", "address": "10.0.0.1"},
        {"kind": "npu-ping", "address": "10.0.0.1"},
        {"kind": "npu-ping", "npu": 64, "address": "10.0.0.1"},
        {"kind": "npu-ping", "npu": 0, "address": "10.0.0.1", "argv": ["x"]},
        {"kind": "shell", "address": "10.0.0.1"},
    ],
)
def test_the_contract_refuses_anything_but_an_ip_and_a_port_in_range(target) -> None:
    with pytest.raises(ValidationError):
        ProbeTarget.model_validate(target)


def test_the_contract_caps_the_number_of_targets_and_results() -> None:
    one = {"kind": "port", "address": "10.0.0.1", "port": 80}
    NetProbeRequest.model_validate({"probe_id": 1, "targets": [one] * MAX_PROBE_TARGETS})
    with pytest.raises(ValidationError, match="at most 64"):
        NetProbeRequest.model_validate({"probe_id": 1, "targets": [one] * 65})
    result = {**one, "ok": True, "detail": "x"}
    with pytest.raises(ValidationError):
        NetProbeReport.model_validate({"node": "n1", "probe_id": 1, "results": [result] * 65})
    with pytest.raises(ValidationError):
        NetProbeReport.model_validate(
            {"node": "n1", "probe_id": 1, "results": [{**result, "detail": "x" * 501}]}
        )
    assert ProbeTarget.model_validate({**one, "address": "::0001"}).address == "::1"
