"""CPU binding (EngineSpec.numa_nodes): the numactl prefix, the refusals before a start, and a
real bound engine when numactl is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.workers.engine.helpers import alive
from tests.workers.engine.test_argv import make_spec
from workers.accelerators.numa import host_layout, parse_cpulist
from workers.contracts import EnginePhase as P
from workers.engine import numa
from workers.engine.argv import build_argv

NUMACTL = shutil.which("numactl")
needs_numactl = pytest.mark.skipif(NUMACTL is None, reason="numactl is not installed here")


def nodes_tree(root: Path, nodes: dict[int, str]) -> Path:
    for node, cpus in nodes.items():
        path = root / "sys/devices/system/node" / f"node{node}"
        path.mkdir(parents=True)
        (path / "cpulist").write_text(cpus + "\n")
    return root


def test_argv_runs_under_numactl_on_the_nodes():
    argv = build_argv(make_spec(numa_nodes=[1, 0, 1]), "/venv/bin/python", "/usr/bin/numactl")
    assert argv[:5] == [
        "/usr/bin/numactl",
        "--cpunodebind=0,1",
        "--membind=0,1",
        "/venv/bin/python",
        "-m",
    ]
    assert argv[5:] == build_argv(make_spec(), "/venv/bin/python")[2:]  # the rest unchanged


def test_no_binding_no_prefix():
    assert build_argv(make_spec(), "/venv/bin/python", "/usr/bin/numactl")[0] == "/venv/bin/python"


def test_refused_when_numactl_is_absent(tmp_path):
    root = nodes_tree(tmp_path, {0: "0-23"})
    why = numa.binding_refusal([0], numactl=None, root=root)
    assert "needs numactl, which is not installed on this host" in why
    assert "install numactl" in why and "CPU binding to off" in why


def test_refused_against_the_hosts_real_layout(tmp_path):
    root = nodes_tree(tmp_path, {0: "0-23", 1: "24-47", 2: ""})
    assert numa.binding_refusal([0, 1], numactl="/usr/bin/numactl", root=root) is None
    assert numa.binding_refusal([3], numactl="/usr/bin/numactl", root=root) == (
        "NUMA node 3 does not exist on this host (its nodes: 0,1,2)"
    )
    assert "NUMA node 2 has no CPUs" in numa.binding_refusal(
        [2], numactl="/usr/bin/numactl", root=root
    )
    assert numa.binding_refusal([], numactl=None, root=root) is None  # nothing asked


def test_supervisor_refuses_a_bound_spec_without_numactl(supervisor, spec, reports, monkeypatch):
    monkeypatch.setattr(numa, "find_numactl", lambda: None)
    report = supervisor().start(spec(numa_nodes=[0]))
    assert report.phase == P.FAILED and report.pid is None  # nothing was started
    assert "needs numactl" in report.reason
    assert reports.phases() == [P.FAILED]


def test_supervisor_refuses_a_node_the_host_does_not_have(supervisor, spec):
    report = supervisor().start(spec(numa_nodes=[1023]))
    assert report.phase == P.FAILED and report.pid is None
    assert "NUMA node 1023 does not exist on this host" in report.reason


@needs_numactl
def test_numactl_show_under_the_prefix():
    node = next(iter(host_layout()))
    shown = subprocess.run(
        [*numa.numa_prefix([node], NUMACTL), NUMACTL, "--show"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert re.search(rf"^nodebind: {node}\s*$", shown, re.M), shown
    assert re.search(rf"^membind: {node}\s*$", shown, re.M), shown


@needs_numactl
def test_a_real_engine_runs_bound_to_its_node(supervisor, spec, reports):
    node, cpus = next(iter(host_layout().items()))
    first = supervisor().start(spec(numa_nodes=[node]))
    ready = reports.wait(P.READY)
    assert ready.pid == first.pid and alive(ready.pid)  # numactl exec'd: the engine's own pid
    assert sorted(psutil.Process(ready.pid).cpu_affinity()) == parse_cpulist(cpus)
    header = open(ready.log_path).read().splitlines()[1]
    assert header.startswith(f"=== argv: {NUMACTL} --cpunodebind={node} --membind={node} ")
