"""Top-1 category accuracy of the diagnosis rules over every real failure sample.

Scores tests/fixtures/ascend/err-* and tests/fixtures/engine/err-*.log (when captured) against
the category a reader assigned to each file (tests/console/diagnosis/expected.py), lists the
misses, and times the matcher on a 10,000-line log. Pure Python: no database.

    .venv/bin/python bench/diagnosis_accuracy.py
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.diagnosis.matcher import diagnose  # noqa: E402
from tests.console.diagnosis.expected import EXPECTED  # noqa: E402
from tests.console.diagnosis.samples import error_samples, log_text  # noqa: E402


@dataclass
class Score:
    correct: int = 0
    scored: int = 0
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # file, expected, got
    unlabelled: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.correct / self.scored if self.scored else 0.0


def score() -> Score:
    result = Score()
    for path in error_samples():
        expected = EXPECTED.get(path.name)
        if expected is None:
            result.unlabelled.append(path.name)
            continue
        found = diagnose(log_text(path))
        got = found[0].category if found else "(nothing)"
        result.scored += 1
        if got == expected:
            result.correct += 1
        else:
            result.misses.append((path.name, expected, got))
    return result


def time_10k_lines() -> float:
    samples = [log_text(p) for p in error_samples()]
    lines = "\n".join(samples).splitlines()
    text = "\n".join((lines * (10_000 // len(lines) + 1))[:10_000])
    diagnose(text)  # warm the rule book
    start = time.perf_counter()
    diagnose(text)
    return time.perf_counter() - start


def main() -> None:
    s = score()
    print(f"top-1 category accuracy: {s.correct}/{s.scored} = {s.ratio:.1%}")
    for name, expected, got in s.misses:
        print(f"  miss: {name}: expected {expected}, got {got}")
    for name in s.unlabelled:
        print(f"  unlabelled (not scored): {name}")
    print(f"10,000-line log: {time_10k_lines() * 1000:.0f} ms")


if __name__ == "__main__":
    main()
