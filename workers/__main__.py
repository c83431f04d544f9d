"""Command line of the host agent: `python -m workers <command> ...`.

Commands are registered in COMMANDS (name -> help, add_arguments, run); run returns the
exit status. Add a command by adding an entry (the agent will add `agent`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from workers.accelerators import probe_all
from workers.accelerators.ascend import parse_npu_smi_info
from workers.accelerators.base import NpuSmiReport, ParseError

EXIT_UNREADABLE = 2


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def _pair(used: int | None, total: int | None) -> str:
    return "-" if used is None and total is None else f"{_fmt(used)}/{_fmt(total)}"


_ROW = "{:>4} {:>4}  {:<10} {:<8} {:>8} {:>6} {:>7} {:>13} {:>13}  {}"
_HEADER = ("NPU", "Chip", "Name", "Health", "Power", "Temp", "AICore", "Memory(MB)", "HBM(MB)")


def format_report(report: NpuSmiReport) -> str:
    """A human-readable table of a parsed npu-smi report."""
    lines = [f"npu-smi version: {report.version or 'unknown'}", _ROW.format(*_HEADER, "Bus-Id")]
    for c in report.npus:
        cells = (
            c.npu_id,
            c.chip_id,
            c.name or "-",
            c.health or "-",
            _fmt(c.power_w, "W"),
            _fmt(c.temperature_c, "C"),
            _fmt(c.aicore_percent, "%"),
            _pair(c.memory_used_mb, c.memory_total_mb),
            _pair(c.hbm_used_mb, c.hbm_total_mb),
            c.bus_id or "-",
        )
        lines.append(_ROW.format(*cells))
    lines.append(f"processes: {len(report.processes)}")
    for p in report.processes:
        chip = "-" if p.chip_id is None else p.chip_id
        memory = _fmt(p.memory_mb, " MB")
        lines.append(f"  NPU {p.npu_id} chip {chip}: pid {p.pid} {p.name} {memory}")
    return "\n".join(lines)


def _read_input(path: str) -> str:
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace")
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _add_parse_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="captured `npu-smi info` output, or - for stdin")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run_parse_npu_smi(args: argparse.Namespace) -> int:
    """Print the parsed table; exit 2 with one line on stderr if it cannot be read."""
    try:
        report = parse_npu_smi_info(_read_input(args.file))
    except (OSError, ParseError) as exc:
        print(f"parse-npu-smi: cannot read {args.file}: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report))
    return 0


def _add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--simulated", action="store_true", help="also report the simulated provider"
    )


def run_probe(args: argparse.Namespace) -> int:
    """Print what this host's providers find right now."""
    found = probe_all(simulated=args.simulated)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    host = found["host"]
    print(f"{host['hostname']} ({host['arch']}, {host['cpu_model']}, {host['os']})")
    print("versions: " + ", ".join(f"{k}={v}" for k, v in found["versions"].items()))
    for name in ("ascend", "nvidia", "simulated"):
        if name in found:
            result = found[name]
            state = f"{len(result['chips'])} chips" if result["available"] else "unavailable"
            reason = f" ({result['reason']})" if result["reason"] else ""
            print(f"{name}: {state}{reason}")
    return 0


def _add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulated",
        action="store_true",
        help="report simulated NPUs replayed from captured npu-smi samples (demo)",
    )
    parser.add_argument("--node-name", help="overrides NPU_AGENT_NODE_NAME")


def run_agent(args: argparse.Namespace) -> int:
    """Run the host agent (configured by NPU_AGENT_* variables) until SIGTERM."""
    import logging
    import os

    from workers.agent import run
    from workers.config import AgentConfig, ConfigError

    env = dict(os.environ)
    if args.simulated:
        env["NPU_AGENT_PROVIDERS"] = "simulated"
    if args.node_name:
        env["NPU_AGENT_NODE_NAME"] = args.node_name
    try:
        config = AgentConfig.from_env(env)
    except ConfigError as exc:
        print(f"agent: configuration error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run(config)


Command = tuple[
    str,
    Callable[[argparse.ArgumentParser], None],
    Callable[[argparse.Namespace], int],
]
COMMANDS: dict[str, Command] = {
    "parse-npu-smi": (
        "parse captured `npu-smi info` output",
        _add_parse_arguments,
        run_parse_npu_smi,
    ),
    "probe": ("report this host's accelerators now", _add_probe_arguments, run_probe),
    "agent": ("run the host agent (Celery worker + heartbeats)", _add_agent_arguments, run_agent),
}


def build_parser(commands: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    """The argparse parser with one subcommand per COMMANDS entry."""
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, run) in (commands or COMMANDS).items():
        subparser = subparsers.add_parser(name, help=help_text)
        add_arguments(subparser)
        subparser.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
