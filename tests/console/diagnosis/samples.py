"""Where the diagnosis tests find their real samples, and how a fixture becomes log text."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[3] / "tests/fixtures"
ASCEND = FIXTURES / "ascend"
ENGINE = FIXTURES / "engine"


def resolve(name: str) -> Path | None:
    """The fixture file called `name` (ascend/ first, then engine/), or None."""
    for folder in (ASCEND, ENGINE):
        path = folder / name
        if path.is_file():
            return path
    return None


def log_text(path: Path) -> str:
    """The fixture as the log it captured: the leading `# source:` / `# exit code` header
    lines say where it came from and are not part of the log, so they are dropped."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    while lines and lines[0].startswith("# "):
        lines.pop(0)
    return "\n".join(lines)


def error_samples() -> list[Path]:
    """Every real failure sample: ascend/err-* and engine/err-*.log (when captured)."""
    return sorted(ASCEND.glob("err-*")) + sorted(ENGINE.glob("err-*.log"))
