"""Write console/deployments/vllm_serve_flags.txt from a real vLLM's own `serve` parser.

Run with the engine environment's python:  .venv-engine/bin/python scripts/gen-vllm-flags.py
The console checks deployments' extra args against this list, so it must come from the engine.
"""

import sys
from pathlib import Path

import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser())
flags = sorted(
    {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}
)
out = Path(__file__).resolve().parent.parent / "console" / "deployments" / "vllm_serve_flags.txt"
out.write_text(
    f"# Flags of `vllm serve` from vLLM {vllm.__version__}'s own argument parser "
    "(scripts/gen-vllm-flags.py). Regenerate when the engine is upgraded.\n"
    + "\n".join(flags)
    + "\n"
)
print(f"{len(flags)} flags -> {out}", file=sys.stderr)
