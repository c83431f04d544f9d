"""hccn_tool: the NPU network of an Ascend host (RoCE ports, vNIC, TLS, /etc/hccn.conf).

Commands run from argv lists (never a shell) through process.run_tool, each with a time
limit; a runner can be injected (tests feed real published outputs). Parsers are tolerant:
unknown lines are ignored and a value that is not printed is None.

Formats, and where they come from (each parser is tested on the real outputs saved in
tests/fixtures/hccn/, every file naming its source):
- the printf formats of the driver's own hccn_tool source (verylucky01/driver @ e29d066,
  src/custom/network/hccn/ascend910B/hccn_tool/: tool_ops.c "link status: UP|DOWN",
  "net health status: %s", "vnic ipaddr: %s"; tool_ops_ext.c "ipaddr:%s",
  "default gateway:%s, Iface:eth%d"; tool_tls.c "dev_id:%d, tls switch[%u](...)");
- the RoCE `-ping` lines are printed by the device, not by hccn_tool: only published
  outputs show them ("device 0 PING <ip>", "recv seq=0,time=0.067000ms",
  "recv time out seq=0", "3 packets transmitted, 3 received, 0.00% packet loss");
- `-hccs_ping` (A3 super pods): NO published output was found. parse_ping reads it from the
  printf format of the driver source (hccn_product_ext/tool_cmd.c tool_ping_printf:
  "This pkt ping success!", "%u packets transmitted, %u received, %.2Lf%% packets loss")
  and is tested on text built from that format, not on a capture.
- /etc/hccn.conf keys are "<name>_<phy_id>=<value>" (cfg.c cfg_read_conf: "%s_%d"); only the
  IPv4 keys address_N / netmask_N / gateway_N / netdetect_N are read: no published IPv6
  hccn.conf was found.
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .process import ToolRun, run_tool

HCCN_TOOL = "hccn_tool"
HCCN_TOOL_FALLBACK = "/usr/local/Ascend/driver/tools/hccn_tool"  # where the driver installs it
HCCN_CONF = "/etc/hccn.conf"
NO_TOOL = "no hccn_tool: not an Ascend host or tools not mounted"  # the checks' skip evidence
TIMEOUT_S = 10.0
PING_TIMEOUT_S = 30.0  # -hccs_ping polls its result once a second for up to ~10 s
MAX_PARALLEL = 8  # concurrent `-g` queries (Huawei's own msprechecker runs them in parallel)

Runner = Callable[[Sequence[str], float], ToolRun]

_LINK = re.compile(r"^\s*link status\s*:\s*(\S+)", re.M)
_NET_HEALTH = re.compile(r"^\s*net health status\s*:\s*(.*?)\s*$", re.M)
_IPADDR = re.compile(r"^\s*ipaddr\s*:\s*(\S+)", re.M)
_NETMASK = re.compile(r"^\s*netmask\s*:\s*(\S+)", re.M)
_VNIC_LINK = re.compile(r"^\s*vnic link status\s*:\s*(\S+)", re.M)
_VNIC_IP = re.compile(r"^\s*vnic ipaddr\s*:\s*(\S+)", re.M)
_VNIC_MASK = re.compile(r"^\s*vnic netmask\s*:\s*(\S+)", re.M)
_GATEWAY = re.compile(r"default gateway\s*:\s*([^,\s]+)(?:\s*,\s*Iface\s*:\s*(\S+))?")
_TLS = re.compile(r"dev_id\s*:\s*(\d+)\s*,\s*tls switch\s*\[\s*(\d)\s*\]")
_PING_HEAD = re.compile(r"device\s+(\d+)\s+PING6?\s+(\S+)")
_PING_SUMMARY = re.compile(
    r"(\d+)\s+packets transmitted,\s*(\d+)\s+received,\s*([\d.]+)%\s*packets?\s+loss"
)
_PING_BAD = re.compile(
    r"recv time out seq|Destination Host Unreachable|Message too long"
    r"|This pkt (?!ping success)"  # -hccs_ping: send fail / not start / check recv msg fail
)
_CONF_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*?)_(\d+)\s*=\s*(.*?)\s*$")


def resolve_tool(configured: str = HCCN_TOOL) -> str | None:
    """The hccn_tool to run: `configured` when it names an executable (a path, or a name on
    PATH), else the driver's own path; None when neither exists (not an Ascend host, or the
    driver tools are not mounted into this container)."""
    for candidate in (configured, HCCN_TOOL_FALLBACK):
        found = shutil.which(candidate) if candidate else None
        if found:
            return found
    return None


def _first(pattern: re.Pattern[str], text: str) -> str | None:
    match = pattern.search(text)
    return match[1] if match else None


def parse_link(text: str) -> str | None:
    """`-link -g`: "UP" or "DOWN" (upper-cased as printed), None if not printed."""
    value = _first(_LINK, text)
    return value.upper() if value else None


def parse_net_health(text: str) -> str | None:
    """`-net_health -g`: the status word(s) as printed: Success, Fault, Init, Socket fail…"""
    return _first(_NET_HEALTH, text) or None


def parse_ip(text: str) -> tuple[str | None, str | None]:
    """`-ip -g` (A2 RoCE port): (ipaddr, netmask); (None, None) when no IP is set."""
    return _first(_IPADDR, text), _first(_NETMASK, text)


def parse_vnic(text: str) -> tuple[str | None, str | None, str | None]:
    """`-vnic -g` (A3): (link status, ipaddr, netmask)."""
    link = _first(_VNIC_LINK, text)
    return (link.upper() if link else None), _first(_VNIC_IP, text), _first(_VNIC_MASK, text)


def parse_gateway(text: str) -> tuple[str | None, str | None]:
    """`-gateway -g`: (gateway address, interface), e.g. ("192.168.6.1", "eth0")."""
    match = _GATEWAY.search(text)
    return (match[1], match[2]) if match else (None, None)


def parse_tls(text: str) -> dict[int, bool]:
    """`-tls -g` (one device, or a loop of them): {dev_id: TLS enabled}; certificate lines
    are ignored."""
    return {int(dev): switch == "1" for dev, switch in _TLS.findall(text)}


@dataclass(frozen=True, slots=True)
class PingResult:
    """One `-ping` / `-hccs_ping`: ok only when every packet came back."""

    ok: bool
    target: str | None = None
    sent: int | None = None
    received: int | None = None
    loss_percent: float | None = None
    detail: str = ""


def parse_ping(text: str) -> PingResult:
    """RoCE `-ping -g address X` or A3 `-hccs_ping -g address X` output (module docstring:
    the -hccs_ping form is read from the driver's printf format, no capture exists)."""
    head = _PING_HEAD.search(text)
    summary = _PING_SUMMARY.search(text)
    bad = len(_PING_BAD.findall(text))
    target = head[2] if head else None
    if summary is None:
        return PingResult(False, target, detail="no ping summary line in the output")
    sent, received, loss = int(summary[1]), int(summary[2]), float(summary[3])
    ok = sent > 0 and received == sent and loss == 0.0 and bad == 0
    detail = f"{received}/{sent} replies, {loss:g}% loss" + (f", {bad} failed" if bad else "")
    return PingResult(ok, target, sent, received, loss, detail)


def parse_hccn_conf(text: str) -> dict[int, dict[str, str]]:
    """/etc/hccn.conf as {index: {name: value}}: `address_3=10.0.0.4` -> {3: {"address": …}}.
    Lines that are not `name_N=value` (comments, `...` in a pasted excerpt) are ignored."""
    entries: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        match = _CONF_LINE.match(line)
        if match:
            entries.setdefault(int(match[2]), {})[match[1]] = match[3]
    return entries


@dataclass(slots=True)
class NpuNetwork:
    """What hccn_tool says about one NPU (device id as `hccn_tool -i` takes it)."""

    device: int
    link: str | None = None
    net_health: str | None = None
    ip: str | None = None
    netmask: str | None = None
    vnic_link: str | None = None
    vnic_ip: str | None = None
    vnic_netmask: str | None = None
    gateway: str | None = None
    tls: bool | None = None
    errors: dict[str, str] = field(default_factory=dict)  # option -> why it gave nothing


def _query(runner: Runner, tool: str, device: int, option: str, timeout: float) -> ToolRun:
    return runner([tool, "-i", str(device), option, "-g"], timeout)


def query_npu(
    tool: str,
    device: int,
    *,
    vnic: bool = False,
    runner: Runner = run_tool,
    timeout: float = TIMEOUT_S,
) -> NpuNetwork:
    """Link, net health, IP, gateway and TLS of one NPU (and the vNIC on A3). Never raises:
    a command that prints nothing usable leaves its fields None and says why in `errors`."""
    npu = NpuNetwork(device)
    options = ["-link", "-net_health", "-ip", "-gateway", "-tls"] + (["-vnic"] if vnic else [])
    for option in options:
        run = _query(runner, tool, device, option, timeout)
        text = f"{run.stdout}\n{run.stderr}"
        if option == "-link":
            npu.link = parse_link(text)
        elif option == "-net_health":
            npu.net_health = parse_net_health(text)
        elif option == "-ip":
            npu.ip, npu.netmask = parse_ip(text)
        elif option == "-gateway":
            npu.gateway = parse_gateway(text)[0]
        elif option == "-tls":
            tls = parse_tls(text)
            npu.tls = tls.get(device, next(iter(tls.values()), None))
        else:
            npu.vnic_link, npu.vnic_ip, npu.vnic_netmask = parse_vnic(text)
        failure = run.failure()
        if failure is not None:
            npu.errors[option] = failure
    return npu


def query_network(
    tool: str,
    devices: Sequence[int],
    *,
    vnic: bool = False,
    runner: Runner = run_tool,
    timeout: float = TIMEOUT_S,
) -> tuple[list[NpuNetwork], str | None]:
    """Every device's NpuNetwork, in device order, and None; or ([], why) when the first
    `-link -g` shows the tool itself is unusable (missing, hanging): the other queries would
    only wait out their time limits."""
    if not devices:
        return [], None
    probe = _query(runner, tool, devices[0], "-link", timeout)
    if probe.returncode is None and parse_link(probe.stdout) is None:
        return [], probe.failure()
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(devices))) as pool:
        found = pool.map(
            lambda d: query_npu(tool, d, vnic=vnic, runner=runner, timeout=timeout), devices
        )
        return list(found), None


def ping(
    npu: int,
    address: str,
    *,
    tool: str = HCCN_TOOL,
    hccs: bool = False,
    runner: Runner = run_tool,
    timeout: float = PING_TIMEOUT_S,
) -> PingResult:
    """`hccn_tool -i <npu> -ping -g address <address>` (A3 super pod, vNIC peer: hccs=True,
    `-hccs_ping`), run on this host towards a peer NPU's IP.

    Run by host.net_probe (workers/netprobe.py) before a multi-host replica starts; the
    console's preflight turns the answers into findings (console/deployments/preflight.py
    connectivity_findings)."""
    option = "-hccs_ping" if hccs else "-ping"
    run = runner([tool, "-i", str(npu), option, "-g", "address", address], timeout)
    result = parse_ping(f"{run.stdout}\n{run.stderr}")
    if run.returncode is None or (run.returncode != 0 and result.sent is None):
        return PingResult(False, address, detail=run.failure() or "no output")
    return result


@dataclass(frozen=True, slots=True)
class Reachability:
    ok: bool
    detail: str


def tcp_reachable(host: str, port: int, timeout: float = 3.0) -> Reachability:
    """Whether a TCP connection to host:port opens within `timeout` (then it is closed).
    Before a group starts nothing listens on its ports: host.net_probe uses
    workers/netprobe.py port_reachable, where a refused connection counts as reachable."""
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        return Reachability(False, f"{host}:{port} not reachable: {reason}")
    return Reachability(True, f"{host}:{port} open ({(time.monotonic() - started) * 1000:.0f} ms)")


# --- the facts the console's preflight reads back from the npu-network check ----------------
# Written into the check's evidence in this one form (format_facts) and read back by
# parse_facts: the check contract carries text only, so both ends live here, tested together.


def _with_prefix(ip: str, netmask: str | None) -> str:
    try:
        return f"{ip}/{ipaddress.IPv4Network(f'0.0.0.0/{netmask}').prefixlen}"
    except (ValueError, TypeError):
        return ip


def _ip_list(pairs: Iterable[tuple[int, str | None, str | None]]) -> str:
    return " ".join(f"{d}={_with_prefix(ip, mask)}" for d, ip, mask in pairs if ip)


def tls_summary(npus: Sequence[NpuNetwork]) -> str:
    """ "off" / "on" when every NPU agrees, "mixed (0=off 1=on)", or "unknown"."""
    states = {n.device: n.tls for n in npus}
    if not states or None in states.values():
        return "unknown"
    if len(set(states.values())) == 1:
        return "on" if next(iter(states.values())) else "off"
    return "mixed (" + " ".join(f"{d}={'on' if s else 'off'}" for d, s in states.items()) + ")"


def format_facts(npus: Sequence[NpuNetwork]) -> str:
    """ "NPU IPs: 0=10.20.11.11/24 1=…. vNIC IPs: …. TLS: off." (parts with no value left out)."""
    parts = []
    ips = _ip_list((n.device, n.ip, n.netmask) for n in npus)
    vnics = _ip_list((n.device, n.vnic_ip, n.vnic_netmask) for n in npus)
    if ips:
        parts.append(f"NPU IPs: {ips}.")
    if vnics:
        parts.append(f"vNIC IPs: {vnics}.")
    gateways = {n.device: n.gateway for n in npus if n.gateway}
    if len(gateways) == len(npus) and len(set(gateways.values())) == 1:
        parts.append(f"Gateway: {next(iter(gateways.values()))} on all.")
    elif gateways:
        parts.append("Gateways: " + " ".join(f"{d}={g}" for d, g in gateways.items()) + ".")
    parts.append(f"TLS: {tls_summary(npus)}.")
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class NetworkFacts:
    ips: dict[int, str] = field(default_factory=dict)  # device -> "10.20.11.11/24"
    vnic_ips: dict[int, str] = field(default_factory=dict)
    tls: str | None = None  # tls_summary(); None when the evidence carries no facts


def _read_ips(label: str, text: str) -> dict[int, str]:
    match = re.search(rf"{label}: ((?:\d+=\S+?\s?)+)\.(?:\s|$)", text)
    if not match:
        return {}
    pairs = (item.split("=", 1) for item in match[1].split())
    return {int(d): ip for d, ip in pairs}


def parse_facts(evidence: str) -> NetworkFacts:
    """The facts format_facts() wrote into an npu-network evidence."""
    tls = re.search(r"TLS: (off|on|unknown|mixed \([^)]*\))\.", evidence)
    return NetworkFacts(
        _read_ips("NPU IPs", evidence), _read_ips("vNIC IPs", evidence), tls[1] if tls else None
    )
