"""host_metrics and its /proc, /sys and /etc readers (fake trees for ARM and x86)."""

from __future__ import annotations

import platform
import time
from pathlib import Path

from workers.accelerators.host import cpu_model, disk_usage, host_metrics, numa_nodes, os_name

KUNPENG_CPUINFO = """processor\t: 0
BogoMIPS\t: 200.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid
CPU implementer\t: 0x48
CPU architecture: 8
CPU variant\t: 0x1
CPU part\t: 0xd01
CPU revision\t: 0
"""


def fake_root(tmp_path: Path, cpuinfo: str) -> Path:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(cpuinfo)
    for node, cpus in (("node0", "0-47"), ("node1", "48-95"), ("node10", "96-127")):
        (tmp_path / "sys/devices/system/node" / node).mkdir(parents=True)
        (tmp_path / "sys/devices/system/node" / node / "cpulist").write_text(cpus + "\n")
    (tmp_path / "sys/devices/system/node/possible").write_text("0-2\n")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text(
        'NAME="openEuler"\nPRETTY_NAME="openEuler 22.03 (LTS-SP4)"\n'
    )
    return tmp_path


def test_kunpeng_920_is_named_from_implementer_and_part(tmp_path) -> None:
    assert cpu_model(fake_root(tmp_path, KUNPENG_CPUINFO)) == "Kunpeng 920 (HiSilicon TSV110)"


def test_other_arm_cpu_is_named_by_its_ids(tmp_path) -> None:
    text = KUNPENG_CPUINFO.replace("0x48", "0x41").replace("0xd01", "0xd0c")
    assert cpu_model(fake_root(tmp_path, text)) == "ARM implementer 0x41 part 0xd0c"


def test_x86_model_name(tmp_path) -> None:
    text = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz\n"
    assert cpu_model(fake_root(tmp_path, text)) == "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz"


def test_numa_nodes_in_numeric_order(tmp_path) -> None:
    assert numa_nodes(fake_root(tmp_path, "")) == {
        "node0": "0-47",
        "node1": "48-95",
        "node10": "96-127",
    }


def test_os_pretty_name_and_missing_release(tmp_path) -> None:
    assert os_name(fake_root(tmp_path, "")) == "openEuler 22.03 (LTS-SP4)"
    assert os_name(tmp_path / "empty") is None


def test_unreadable_disk_path_reports_an_error(tmp_path) -> None:
    disks = disk_usage([str(tmp_path), str(tmp_path / "absent")])
    assert disks[str(tmp_path)]["total_mb"] > 0
    assert "error" in disks[str(tmp_path / "absent")]


def test_host_metrics_keys_and_no_blocking(tmp_path) -> None:
    started = time.monotonic()
    metrics = host_metrics([str(tmp_path)], root=fake_root(tmp_path, KUNPENG_CPUINFO))
    assert time.monotonic() - started < 0.9  # a blocking cpu_percent(interval=1) takes 1 s
    assert set(metrics) == {
        "hostname", "arch", "cpu_model", "cpu_cores", "cpu_percent", "load_avg",
        "memory_total_mb", "memory_used_mb", "disks", "numa_node_count", "numa_cpulists",
        "numa_memory_mb", "os", "kernel", "listening_ports", "interfaces",
    }  # fmt: skip
    assert metrics["arch"] == platform.machine()
    assert metrics["cpu_model"] == "Kunpeng 920 (HiSilicon TSV110)"
    assert metrics["cpu_cores"]["logical"] >= 1 and len(metrics["load_avg"]) == 3
    assert 0 < metrics["memory_used_mb"] <= metrics["memory_total_mb"]
    assert metrics["numa_node_count"] == 3
    assert metrics["os"] == "openEuler 22.03 (LTS-SP4)"
    assert 0.0 <= metrics["cpu_percent"] <= 100.0


def test_real_host_metrics_are_filled() -> None:
    metrics = host_metrics()
    assert metrics["hostname"] and metrics["kernel"] == platform.release()
    assert metrics["disks"]["/"]["total_mb"] > 0


def test_a_port_something_listens_on_is_reported():
    import socket

    from workers.accelerators.host import host_metrics, listening_ports
    from workers.contracts import HostInfo

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port in listening_ports()
        info = HostInfo.model_validate(host_metrics())
        assert port in info.listening_ports
    assert port not in listening_ports()


def test_interfaces_name_this_hosts_addresses():
    from workers.accelerators.host import interfaces
    from workers.contracts import HostInfo

    found = interfaces()
    assert "127.0.0.1" in found["lo"]
    assert HostInfo.model_validate(host_metrics()).interfaces["lo"] == found["lo"]


def test_interfaces_keep_ip_addresses_within_the_caps():
    import socket
    from types import SimpleNamespace as Addr

    from workers.accelerators.host import interfaces
    from workers.contracts import MAX_INTERFACE_ADDRESSES, MAX_INTERFACES

    mac = Addr(family=getattr(socket, "AF_PACKET", 17), address="fe:fc:00:00:00:01")
    found = {f"eth{i:02d}": [Addr(family=socket.AF_INET, address=f"10.0.{i}.1")] for i in range(70)}
    found["eth00"] = [mac, *(Addr(family=socket.AF_INET, address=f"10.9.0.{i}") for i in range(20))]
    found["eth01"] += [Addr(family=socket.AF_INET6, address="fe80::1%eth01"), mac]
    found["a-very-long-name0"] = [Addr(family=socket.AF_INET, address="10.8.0.1")]  # > 15
    found["dummy0"] = [mac]  # no IP address: left out
    got = interfaces(found)
    assert len(got) == MAX_INTERFACES and "a-very-long-name0" not in got and "dummy0" not in got
    assert got["eth00"] == [f"10.9.0.{i}" for i in range(MAX_INTERFACE_ADDRESSES)]
    assert got["eth01"] == ["10.0.1.1", "fe80::1%eth01"]
    assert list(got) == sorted(got)
