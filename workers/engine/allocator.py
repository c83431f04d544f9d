"""The engine setting `allocator` (workers/engine_settings.py): jemalloc or tcmalloc preloaded
into the engine with LD_PRELOAD, the one safe way to set it (extra_env may not).

vllm-ascend's tuning guide (docs/source/developer_guide/performance_and_debug/
optimization_and_tuning.md, "2.1 jemalloc" and "2.2 Tcmalloc") recommends
`apt install libjemalloc2` then `LD_PRELOAD=/usr/lib/$(uname -i)-linux-gnu/libjemalloc.so.2`,
and `apt install libgoogle-perftools4` then LD_PRELOAD of the libtcmalloc.so it installs. The
library is looked up by its fixed file names in the host's standard library directories only,
never at a path a user gave: a deployment names an allocator, not a file. A library that is
not there refuses the start with what to install (`refusal`); nothing runs.
"""

from __future__ import annotations

import platform
from pathlib import Path

# allocator -> (the file names, preferred first; the package that installs them on Debian/Ubuntu)
LIBRARIES: dict[str, tuple[tuple[str, ...], str]] = {
    "jemalloc": (("libjemalloc.so.2", "libjemalloc.so"), "libjemalloc2"),
    "tcmalloc": (
        ("libtcmalloc.so.4", "libtcmalloc.so", "libtcmalloc_minimal.so.4"),
        "libgoogle-perftools4",
    ),
}
# Debian/Ubuntu's multiarch directory first (vllm-ascend's guide), then the RPM and
# locally-built locations. `{arch}` is the machine, e.g. aarch64 or x86_64.
SEARCH_DIRS: tuple[str, ...] = (
    "/usr/lib/{arch}-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)


def search_dirs(root: str | Path = "/") -> list[Path]:
    arch = platform.machine()
    return [Path(root) / d.format(arch=arch).lstrip("/") for d in SEARCH_DIRS]


def find_library(allocator: str, root: str | Path = "/") -> str | None:
    """The path of the allocator's library on this host, or None ("" asks for none)."""
    if allocator not in LIBRARIES:
        return None
    names, _package = LIBRARIES[allocator]
    for directory in search_dirs(root):
        for name in names:
            path = directory / name
            if path.is_file():
                return str(path)
    return None


def refusal(allocator: str, root: str | Path = "/") -> str | None:
    """Why an engine asking for `allocator` must not start on this host, or None."""
    if not allocator:
        return None
    if allocator not in LIBRARIES:
        return f"unknown memory allocator {allocator!r} (jemalloc or tcmalloc)"
    if find_library(allocator, root) is not None:
        return None
    names, package = LIBRARIES[allocator]
    where = ", ".join(str(d) for d in search_dirs(root))
    return (
        f"memory allocator {allocator}: no {' or '.join(names)} in {where}; install it "
        f"(apt-get install {package}) or set the deployment's allocator to the default"
    )


def preload(allocator: str, inherited: str | None = None, root: str | Path = "/") -> str | None:
    """LD_PRELOAD for the engine: the allocator's library first, then what the environment
    already preloads (CANN's, if any); None when there is nothing to preload."""
    library = find_library(allocator, root) if allocator else None
    parts = [p for p in (library, *(inherited or "").split(":")) if p]
    return ":".join(dict.fromkeys(parts)) or None
