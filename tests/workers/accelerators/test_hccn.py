"""hccn_tool parsers on real published outputs (tests/fixtures/hccn/, each names its source),
the agent-side ping and TCP reachability, and the facts the npu-network check hands over."""

from __future__ import annotations

import socket

import pytest

from tests.workers.hccn_support import FIXTURES, FakeHccn, fixture, healthy_outputs
from workers.accelerators import hccn
from workers.accelerators.process import ToolRun


def sections(text: str) -> dict[int, str]:
    """{device: output} of a capture that prints each `hccn_tool -i N ...` command line."""
    found: dict[int, list[str]] = {}
    device = None
    for line in text.splitlines()[1:]:  # after the source line
        if "hccn_tool -i " in line:
            device = int(line.split("-i ", 1)[1].split()[0])
            found[device] = []
        elif device is not None:
            found[device].append(line)
    return {d: "\n".join(lines) for d, lines in found.items()}


def test_every_fixture_names_its_source() -> None:
    files = sorted(FIXTURES.glob("*.txt"))
    assert len(files) >= 19
    for path in files:
        assert path.read_text(encoding="utf-8").startswith("# source: "), path.name


# --- parsers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "status"),
    [("link-up-faultdiag-doc.txt", "UP"), ("link-down-910b-gpustack-test.txt", "DOWN")],
)
def test_link_status(name: str, status: str) -> None:
    assert hccn.parse_link(fixture(name)) == status


def test_link_status_is_not_read_from_a_vnic_line() -> None:
    assert hccn.parse_link(fixture("vnic-950-doc.txt")) is None


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("net-health-success-elastic-training-doc.txt", "Success"),
        ("net-health-fault-elastic-training-doc.txt", "Fault"),
        ("net-health-init-faultdiag-doc.txt", "Init"),
        ("net-health-socket-failed-910a-capture.txt", "Socket failed"),
    ],
)
def test_net_health_keeps_the_status_words(name: str, status: str) -> None:
    assert hccn.parse_net_health(fixture(name)) == status


def test_ip_and_netmask() -> None:
    assert hccn.parse_ip(fixture("ip-910b1-arthurchiao-blog.txt")) == (
        "29.1.112.213",
        "255.255.0.0",
    )


def test_ip_per_npu_of_an_eight_npu_capture() -> None:
    parsed = {d: hccn.parse_ip(t) for d, t in sections(fixture("ip-8npu-910a-capture.txt")).items()}
    assert parsed == {d: (f"10.10.0.1{d}", "255.255.255.0") for d in range(8)}


def test_an_npu_without_ip_gives_none() -> None:
    parsed = sections(fixture("ip-missing-910a-capture.txt"))
    assert hccn.parse_ip(parsed[1]) == ("192.161.201.10", "255.255.255.0")
    assert hccn.parse_ip(parsed[2]) == (None, None)


def test_vnic() -> None:
    assert hccn.parse_vnic(fixture("vnic-950-doc.txt")) == ("UP", "192.168.2.199", "255.255.255.0")
    assert hccn.parse_vnic(fixture("ip-910b1-arthurchiao-blog.txt")) == (None, None, None)


def test_gateway_with_interface_and_leading_blanks() -> None:
    assert hccn.parse_gateway(fixture("gateway-910b-gpustack-test.txt")) == ("192.168.6.1", "eth0")
    lines = fixture("gateway-8npu-910b3-deepseekv3-doc.txt").splitlines()[1:]
    assert [hccn.parse_gateway(line) for line in lines] == [
        ("11.12.165.1", f"eth{i}") for i in range(8)
    ]


def test_tls_switch_per_device() -> None:
    assert hccn.parse_tls(fixture("tls-off-faultdiag-doc.txt")) == {0: False}
    assert hccn.parse_tls(fixture("tls-mismatch-2npu-hccl-doc.txt")) == {0: False, 1: True}


def test_tls_certificate_blocks_are_ignored() -> None:
    assert hccn.parse_tls(fixture("tls-certs-950-doc.txt")) == {0: False}


@pytest.mark.parametrize("name", ["ping-ok-910b1-arthurchiao-blog.txt", "ping-ok-mindie-doc.txt"])
def test_ping_every_reply_back(name: str) -> None:
    result = hccn.parse_ping(fixture(name))
    assert result.ok and (result.sent, result.received, result.loss_percent) == (3, 3, 0.0)
    assert result.target in ("29.1.137.205", "10.10.100.10")


def test_ping_with_a_timed_out_packet_fails() -> None:
    result = hccn.parse_ping(fixture("ping-loss-mindie-doc.txt"))
    assert not result.ok
    assert (result.sent, result.received, result.loss_percent) == (3, 2, 33.33)
    assert result.detail == "2/3 replies, 33.33% loss, 1 failed"


def test_hccs_ping_on_the_driver_source_format() -> None:
    # No published -hccs_ping output exists: these lines follow the printf format of the
    # driver's tool_ping_printf (hccn_product_ext/tool_cmd.c), "\n" included.
    ok = (
        "device 0 PING 192.168.2.198\n\n"
        + "This pkt ping success!\n"
        + "recv seq 0, time = 3.120us, L1 plane check result = 0x0\n\n"
        + "1 packets transmitted, 1 received, 0.00% packets loss\n"
        + "max time 3.120us\nmin time 3.120us\naverage time 3.120us\nTP95 time 3.120us\n"
    )
    assert hccn.parse_ping(ok).ok and hccn.parse_ping(ok).target == "192.168.2.198"
    failed = ok.replace("This pkt ping success!", "This pkt send fail!").replace(
        "1 received, 0.00%", "0 received, 100.00%"
    )
    assert not hccn.parse_ping(failed).ok
    assert hccn.parse_ping(failed).detail == "0/1 replies, 100% loss, 1 failed"


def test_ping_without_a_summary_is_not_ok() -> None:
    assert not hccn.parse_ping("device 0 PING 10.0.0.1\n").ok


def test_hccn_conf_keys_by_index_and_ellipsis_ignored() -> None:
    entries = hccn.parse_hccn_conf(fixture("hccn-conf-910b1-arthurchiao-blog.txt"))
    assert sorted(entries) == [0, 7]
    assert entries[0] == {
        "address": "29.1.137.205",
        "netmask": "255.255.0.0",
        "netdetect": "29.1.0.1",
        "gateway": "29.1.0.1",
        "send_arp_status": "1",
    }


def test_hccn_conf_of_eight_npus() -> None:
    entries = hccn.parse_hccn_conf(fixture("hccn-conf-8npu-notes.txt"))
    assert [entries[i]["address"] for i in range(8)] == [f"10.20.11.1{i + 1}" for i in range(8)]


# --- running hccn_tool ----------------------------------------------------------------------


def test_query_npu_reads_every_field_with_argv_lists() -> None:
    runner = FakeHccn(healthy_outputs())
    npu = hccn.query_npu("/opt/hccn_tool", 3, vnic=True, runner=runner)
    assert (npu.link, npu.net_health, npu.ip, npu.netmask) == (
        "UP", "Success", "29.1.112.213", "255.255.0.0",
    )  # fmt: skip
    assert (npu.vnic_link, npu.vnic_ip, npu.gateway, npu.tls) == (
        "UP", "192.168.2.199", "192.168.6.1", False,
    )  # fmt: skip
    assert runner.calls[0] == ["/opt/hccn_tool", "-i", "3", "-link", "-g"]
    assert npu.errors == {}


def test_query_npu_records_why_a_command_gave_nothing() -> None:
    outputs = healthy_outputs()
    del outputs["-ip"]
    npu = hccn.query_npu("hccn_tool", 0, runner=FakeHccn(outputs))
    assert npu.ip is None
    assert npu.errors == {"-ip": "hccn_tool -i 0 -ip -g exited with status 1: Invalid option"}


def test_query_network_stops_when_the_tool_hangs() -> None:
    calls = []

    def hanging(argv, timeout):
        calls.append(argv)
        return ToolRun(" ".join(argv), None, error=f"hccn_tool timed out after {timeout:g}s")

    npus, fatal = hccn.query_network("hccn_tool", list(range(16)), runner=hanging, timeout=2)
    assert (npus, fatal, len(calls)) == ([], "hccn_tool timed out after 2s", 1)


def test_resolve_tool_prefers_the_configured_one(stand_in, monkeypatch) -> None:
    tool = stand_in("hccn_tool", "exit 0")
    monkeypatch.setattr(hccn, "HCCN_TOOL_FALLBACK", "/nonexistent/hccn_tool")
    assert hccn.resolve_tool(str(tool)) == str(tool)
    assert hccn.resolve_tool("/nonexistent/other") is None
    monkeypatch.setattr(hccn, "HCCN_TOOL_FALLBACK", str(tool))
    assert hccn.resolve_tool("no-such-hccn-tool-on-path") == str(tool)


def test_ping_runs_the_real_tool_with_an_argv_list(stand_in, tmp_path) -> None:
    (tmp_path / "out.txt").write_text(fixture("ping-ok-910b1-arthurchiao-blog.txt"))
    tool = stand_in("hccn_tool", f'echo "$@" > "{tmp_path}/argv"; cat "{tmp_path}/out.txt"')
    result = hccn.ping(3, "29.1.137.205", tool=str(tool), timeout=5)
    assert result.ok and result.detail == "3/3 replies, 0% loss"
    assert (tmp_path / "argv").read_text().split() == [
        "-i", "3", "-ping", "-g", "address", "29.1.137.205",
    ]  # fmt: skip


def test_hccs_ping_option_and_a_failing_tool() -> None:
    seen = []

    def refused(argv, timeout):
        seen.append(argv[3])
        return ToolRun(" ".join(argv), 255, "", "This device does not support this function.")

    result = hccn.ping(0, "192.168.2.198", hccs=True, runner=refused)
    assert seen == ["-hccs_ping"] and not result.ok
    assert "exited with status 255: This device does not support this function." in result.detail


def test_tcp_reachable_open_and_closed_ports() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        opened = hccn.tcp_reachable("127.0.0.1", port, timeout=2)
    closed = hccn.tcp_reachable("127.0.0.1", port, timeout=2)  # the listener is gone
    assert opened.ok and opened.detail.startswith(f"127.0.0.1:{port} open")
    assert not closed.ok and closed.detail.startswith(f"127.0.0.1:{port} not reachable")


# --- the facts handed to the console --------------------------------------------------------


def test_facts_round_trip() -> None:
    npus = [
        hccn.NpuNetwork(0, ip="10.20.11.11", netmask="255.255.255.0", tls=False, gateway="10.20.11.1"),
        hccn.NpuNetwork(1, ip="10.20.11.12", netmask="255.255.255.0", tls=False,
                        vnic_ip="192.168.2.198", vnic_netmask="255.255.255.0"),
    ]  # fmt: skip
    text = "2 NPUs: link UP, net health Success. " + hccn.format_facts(npus)
    assert text.endswith(
        "NPU IPs: 0=10.20.11.11/24 1=10.20.11.12/24. vNIC IPs: 1=192.168.2.198/24. "
        "Gateways: 0=10.20.11.1. TLS: off."
    )
    facts = hccn.parse_facts(text)
    assert facts.ips == {0: "10.20.11.11/24", 1: "10.20.11.12/24"}
    assert (facts.vnic_ips, facts.tls) == ({1: "192.168.2.198/24"}, "off")


def test_tls_summary_mixed_and_unknown() -> None:
    mixed = [hccn.NpuNetwork(0, tls=False), hccn.NpuNetwork(1, tls=True)]
    assert hccn.tls_summary(mixed) == "mixed (0=off 1=on)"
    assert hccn.parse_facts(hccn.format_facts(mixed)).tls == "mixed (0=off 1=on)"
    assert hccn.tls_summary([hccn.NpuNetwork(0)]) == "unknown"
    assert hccn.parse_facts("no facts here") == hccn.NetworkFacts()
