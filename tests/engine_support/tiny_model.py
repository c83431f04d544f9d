"""The tests' way to the tiny model: the builder is product code, workers/tools/tiny_model.py
(`make tiny-model`); this only picks the interpreter that runs it."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from workers.tools.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[2]


def build_tiny_model_with(
    dest: Path, fallback_python: Callable[[], Path | str], **kwargs: object
) -> Path:
    """build_tiny_model here when `tokenizers` imports, else through the CLI
    (`python -m workers.tools.tiny_model`) under `fallback_python()` (the engine venv's
    python, which has it through vLLM). Both give byte-identical files."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        args = [f"--{key.replace('_', '-')}={value}" for key, value in kwargs.items()]
        cmd = [str(fallback_python()), "-m", "workers.tools.tiny_model", str(dest), *args]
        subprocess.run(cmd, check=True, timeout=300, cwd=REPO)
        return Path(dest)
    return build_tiny_model(dest, **kwargs)
