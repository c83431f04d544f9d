"""Host trouble the agent must survive and report: a hanging npu-smi, a full log disk.

Real processes: a console worker, a host agent (its npu-smi a stand-in script on PATH that
hangs; its state dir a tiny tmpfs in a private mount namespace), the stand-in engine.
Promises: docs/faults.md "npu-smi hangs" and "Log disk full".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from console.deployments.models import Replica
from console.deployments.reconcile import reconcile
from console.inventory.heartbeats import SEEN_KEY, mark_offline
from console.inventory.models import Node
from tests.faults.conftest import cpu_deployment
from tests.helpers import client_for, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.worker]
HANG = "3001"  # the stand-in npu-smi sleeps this long; an argument nothing else uses


def seen(name: str) -> float:
    from console.hot import get_redis

    return get_redis().zscore(SEEN_KEY, name) or 0.0


def beat_gaps(name: str, beats: int) -> list[float]:
    """Seconds between the next `beats` heartbeats the console receives from `name`."""
    times = [seen(name)]
    for _ in range(beats):
        times.append(wait_for(lambda: (s := seen(name)) > times[-1] and s, 30, message="a beat"))
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_hanging_npu_smi_times_out_and_the_node_shows_telemetry_degraded(
    console_worker, stand_in_agent, tmp_path, admin_user
):
    began = time.time()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    npu_smi = bin_dir / "npu-smi"
    npu_smi.write_text(f"#!/bin/sh\nexec sleep {HANG}\n")
    npu_smi.chmod(0o755)
    agent = stand_in_agent(
        "fault-smi",
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        NPU_SMI_TIMEOUT_S="1",
        NPU_AGENT_PROVIDERS="ascend",
    )
    node = wait_for(
        lambda: Node.objects.filter(name="fault-smi", telemetry_ok=False).first(),
        30,
        message="telemetry degraded",
    )
    assert node.telemetry_reason == "ascend: npu-smi timed out after 1s"
    gaps = beat_gaps("fault-smi", 4)  # the agent keeps beating, each beat waits out npu-smi
    print("\nbeat gaps with a hanging npu-smi:", [round(g, 2) for g in gaps])
    assert max(gaps) < 5.0  # the node goes offline only after 3 x 5 s without a beat
    assert "fault-smi" not in mark_offline()
    node.refresh_from_db()
    assert node.status == "online" and agent.popen.poll() is None
    assert not hung_npu_smi(began, older_than=3)  # each was killed at its timeout
    client = client_for(admin_user)
    page = client.get(f"/nodes/{node.name}/").content.decode()
    assert "Telemetry degraded: ascend: npu-smi timed out after 1s" in page
    listing = client.get("/nodes/").content.decode()
    assert 'data-testid="telemetry-degraded"' in listing and "npu-smi timed out" in listing
    body = client.get(f"/api/v1/nodes/{node.name}").json()
    assert body["telemetry_ok"] is False and "timed out after 1s" in body["telemetry_reason"]
    agent.stop()  # mid-probe, most likely: the npu-smi in flight goes with it
    assert not hung_npu_smi(began, older_than=0)


def hung_npu_smi(since: float, older_than: float) -> list[psutil.Process]:
    """Stand-in npu-smi processes started after `since` and running for over `older_than` s."""
    return [
        p
        for p in psutil.process_iter(["cmdline", "create_time", "status"])
        if p.info["cmdline"] == ["sleep", HANG]
        and p.info["status"] != psutil.STATUS_ZOMBIE
        and p.info["create_time"] >= since - 1
        and time.time() - p.info["create_time"] > older_than
    ]


def private_tmpfs(path: Path, size: str) -> list[str]:
    """An argv prefix that runs a command with a `size` tmpfs mounted on `path`, visible to
    it and its children only (a private mount namespace: nothing on the host is mounted)."""
    unshare = shutil.which("unshare")
    flags = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    mount = f'mount -t tmpfs -o size={size} npc-faults "$0"'
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(
        [unshare, *flags, "--propagation", "private", "sh", "-c", mount, str(path)],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {probe.stderr.strip()}")
    return [unshare, *flags, "--propagation", "private", "sh", "-c", f'{mount} && exec "$@"']


def answers(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        return resp.status == 200


def test_full_log_disk_keeps_the_engine_serving_and_the_agent_reports_it(
    console_worker, stand_in_agent, tmp_path, model_dir, admin_user
):
    state = tmp_path / "agent-state"
    state.mkdir()
    prefix = private_tmpfs(state, "256k")
    agent = stand_in_agent("fault-disk", argv_prefix=[*prefix, str(state)])
    dep = cpu_deployment("chatty", Node.objects.get(name="fault-disk"), model_dir)
    dep.extra_env = {"FAKE_SPAM_LINES_PER_S": "5000"}  # ~300 kB/s of log lines
    dep.save(update_fields=["extra_env"])
    reconcile()
    node = wait_for(
        lambda: Node.objects.filter(name="fault-disk").exclude(log_error="").first(),
        60,
        message="the agent to report the full log disk",
    )
    assert node.log_error.startswith(f"disk full at {state}") and "bytes free" in node.log_error
    replica = wait_for(
        lambda: Replica.objects.filter(deployment=dep, state="ready").first(),
        30,
        message="the engine to be ready",
    )
    for _ in range(3):  # the disk stays full; the engine goes on answering, beats go on
        assert answers(replica.port)
        beat_gaps("fault-disk", 1)
    replica.refresh_from_db()
    node.refresh_from_db()
    assert replica.state == "ready" and replica.restarts == 0 and node.status == "online"
    assert agent.popen.poll() is None and console_worker.popen.poll() is None
    assert "Exception in thread" not in agent.output()  # no thread of the agent died
    client = client_for(admin_user)
    assert "Engine logs: disk full at" in client.get(f"/nodes/{node.name}/").content.decode()
    assert client.get(f"/api/v1/nodes/{node.name}").json()["log_error"] == node.log_error
