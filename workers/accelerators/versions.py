"""Versions of the Ascend stack on this host: driver, firmware, CANN, Python packages.

Files are read under `root` (tests build a fake tree); packages are looked up with
importlib.metadata, without importing them (importing torch/vllm takes seconds).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from workers.contracts import VERSION_MAX_CHARS, clip

ASCEND = "usr/local/Ascend"
PACKAGES = {
    "vllm": "vllm",
    "vllm_ascend": "vllm-ascend",
    "torch": "torch",
    "torch_npu": "torch-npu",
}
# latest/version.cfg lines look like `toolkit_running_version=[7.3.0.1.231:8.0.RC2]`
# (inner package version, then the CANN release), as pasted in public CANN READMEs.
_RUNNING_VERSION = re.compile(r"\[?[^:\]]*:([^\]]+)\]?")


def read_key_values(path: Path) -> dict[str, str]:
    """`key=value` lines of a file (keys lower-cased); {} when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip().lower(): value.strip() for key, value in pairs}


def _version_of(path: Path) -> str | None:
    return read_key_values(path).get("version") or None


def _toolkit_candidates(root: Path) -> list[Path]:
    arch = platform.machine()
    candidates = []
    for base in (root / ASCEND / "ascend-toolkit/latest", root / ASCEND / "cann"):
        candidates.append(base / f"{arch}-linux/ascend_toolkit_install.info")
        candidates.extend(sorted(base.glob("*-linux/ascend_toolkit_install.info")))
        candidates.append(base / "ascend_toolkit_install.info")
    return candidates


def cann_version(root: Path) -> str | None:
    """CANN toolkit version: ascend_toolkit_install.info `version=`, or version.cfg."""
    for path in _toolkit_candidates(root):
        version = _version_of(path)
        if version:
            return version
    cfg = read_key_values(root / ASCEND / "ascend-toolkit/latest/version.cfg")
    if cfg.get("version"):
        return cfg["version"]
    match = _RUNNING_VERSION.fullmatch(cfg.get("toolkit_running_version", ""))
    return match[1] if match else None


def package_versions(python: str | None = None) -> dict[str, str | None]:
    """Installed versions of vllm, vllm-ascend, torch and torch-npu (None if absent): in the
    environment of `python` (the engines' interpreter) when it is another one than the
    agent's own — what the engines run is what a multi-host group must agree on
    (console/deployments/preflight.py) — else in the agent's own."""
    # venv interpreters are symlinks to one base python: compare the paths, never resolved
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):
        found = _versions_in(str(Path(python)))
        if found is not None:
            return dict(found)
    versions: dict[str, str | None] = {}
    for key, distribution in PACKAGES.items():
        try:
            versions[key] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            versions[key] = None
    return versions


# Run by the engine python: metadata only, no package imported (importing torch takes seconds)
_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for key, dist in json.loads(sys.argv[1]).items():\n"
    "    try: out[key] = m.version(dist)\n"
    "    except m.PackageNotFoundError: out[key] = None\n"
    "print(json.dumps(out))\n"
)


@functools.lru_cache(maxsize=4)
def _versions_in(python: str) -> tuple[tuple[str, str | None], ...] | None:
    """The packages' versions as `python` sees them (argv list, 30 s limit; cached for the
    agent's life: an engine env changes with an agent restart). None when it cannot tell."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", _PROBE, json.dumps(PACKAGES)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        found = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        found = None
    if not isinstance(found, dict):
        return None
    return tuple(
        (key, found.get(key) if isinstance(found.get(key), str) else None) for key in PACKAGES
    )


def detect_versions(root: str | Path = "/", python: str | None = None) -> dict[str, str | None]:
    """Keys npu_driver, npu_firmware, cann_toolkit, vllm, vllm_ascend, torch, torch_npu (the
    packages as the engines' interpreter `python` sees them, when given).

    Missing files or packages give None; never raises for a missing or unreadable file.
    A value longer than the contract's VERSION_MAX_CHARS is cut with a visible marker.
    """
    base = Path(root)
    found = {
        "npu_driver": _version_of(base / ASCEND / "driver/version.info"),
        "npu_firmware": _version_of(base / ASCEND / "firmware/version.info"),
        "cann_toolkit": cann_version(base),
        **package_versions(python),
    }
    return {key: clip(v, VERSION_MAX_CHARS) if v else v for key, v in found.items()}
