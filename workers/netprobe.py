"""host.net_probe: a member of a multi-host replica checks, before the group starts, that it
reaches its peers (console/deployments/netprobe.py asks, groups.check_connectivity judges).

Two kinds of target (workers.contracts.ProbeTarget, validated before anything runs):

- `npu-ping`: `hccn_tool -i <npu> -ping -g address <ip>` (A3 HCCS peer: `-hccs_ping`), the
  RoCE/HCCS path between two NPUs (workers/accelerators/hccn.py ping, parse_ping);
- `port`: a TCP connect to the leader's DP RPC port. Before the start nothing listens there
  yet, so an open connection is not what to expect. What each outcome proves:
  * connected: the path is open (something already listens: the port is reachable);
  * refused (ECONNREFUSED): a TCP RST (or an ICMP port-unreachable) came back from the
    address: the path is routed and answers. Counted as reachable. It cannot tell a closed
    port from a firewall rule that REJECTs with a reset or port-unreachable (iptables'
    default REJECT): such a rule would be missed. A REJECT with host-prohibited (firewalld's
    default) arrives as EHOSTUNREACH and fails;
  * no answer within the timeout: a filter DROPs the packets (most security groups, a DROP
    policy) or the address is unreachable: fails;
  * unreachable host or network (EHOSTUNREACH, ENETUNREACH, …): fails.

Bounded: at most MAX_PROBE_TARGETS targets, run PARALLEL at a time, each with its own time
limit, all within BUDGET_S (a target that could not start in time says so and fails): the
answer comes within about BUDGET_S. No Django here.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from workers.accelerators import hccn
from workers.accelerators.process import run_tool
from workers.contracts import PROBE_DETAIL_MAX_CHARS, ProbeTarget, clip

BUDGET_S = 15.0  # the whole answer
PING_TIMEOUT_S = 12.0  # one hccn_tool ping (3 packets a second apart; -hccs_ping polls ~10 s)
CONNECT_TIMEOUT_S = 3.0  # one TCP connect
PARALLEL = 16  # an A3 host has 16 NPUs: one ping per local NPU at once

Connect = Callable[[tuple[str, int], float], socket.socket]


def port_reachable(
    address: str,
    port: int,
    *,
    timeout: float = CONNECT_TIMEOUT_S,
    connect: Connect = socket.create_connection,
) -> tuple[bool, str]:
    """(reachable, evidence) for address:port before anything listens there (module
    docstring: refused counts as reachable, a timeout does not)."""
    where = f"{address}:{port}"
    started = time.monotonic()
    try:
        with connect((address, port), timeout):
            pass
    except ConnectionRefusedError:
        ms = (time.monotonic() - started) * 1000
        return True, (
            f"{where} refused the connection in {ms:.0f} ms: the host answers on this path "
            "and nothing drops it (nothing listens there yet)"
        )
    except TimeoutError:
        return False, (
            f"{where}: no answer within {timeout:g}s: a firewall drops the packets or the "
            "address is unreachable"
        )
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, "")
        reason = exc.strerror or str(exc) or type(exc).__name__
        return False, f"{where} not reachable: {reason}" + (f" ({name})" if name else "")
    ms = (time.monotonic() - started) * 1000
    return True, f"{where} open ({ms:.0f} ms): something already listens there"


def run_probes(
    targets: Sequence[ProbeTarget],
    *,
    tool: str | None,
    runner: hccn.Runner | None = None,
    connect: Connect = socket.create_connection,
    budget_s: float = BUDGET_S,
    ping_timeout_s: float = PING_TIMEOUT_S,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> list[dict]:
    """One result per target, in order: the target's fields, ok and detail. `tool`: the
    hccn_tool to run (None: none on this host, every npu-ping fails saying so). Never
    raises for a target."""
    deadline = time.monotonic() + budget_s
    runner = runner or run_tool

    def one(target: ProbeTarget) -> dict:
        ok, detail = _run(target)
        return {**target.model_dump(), "ok": ok, "detail": clip(detail, PROBE_DETAIL_MAX_CHARS)}

    def _run(target: ProbeTarget) -> tuple[bool, str]:
        left = deadline - time.monotonic()
        if left < 0.5:
            return False, f"not run: the probe's {budget_s:g}s budget was spent on other targets"
        try:
            if target.kind == "port":
                return port_reachable(
                    target.address,
                    target.port,
                    timeout=min(connect_timeout_s, left),
                    connect=connect,
                )
            if tool is None:
                return False, hccn.NO_TOOL
            found = hccn.ping(
                target.npu,
                target.address,
                tool=tool,
                hccs=target.hccs,
                runner=runner,
                timeout=min(ping_timeout_s, left),
            )
            option = "-hccs_ping" if target.hccs else "-ping"
            return found.ok, f"NPU {target.npu} {option} {target.address}: {found.detail}"
        except Exception as exc:  # noqa: BLE001 - one target's failure is its own answer
            return False, f"{type(exc).__name__}: {exc}"

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(targets))) as pool:
        return list(pool.map(one, targets))
