"""5 MB of adversarial log text diagnosed, each shape timed (target: <= 2 s each).

Shapes: one 5 MB line of the issue's `/health: no answer: ` (5.4 s for 300 KB with the old
backtracking matcher); 300 KB lines made of every rule's own keywords; short lines of the same;
5 MB of failure lines made of the words the guess by wording knows best (wording.py; the guess
reads at most MAX_CHARS of a log's first failure lines, cut to MAX_LINE_CHARS pieces); and a benign 5 MB log (the rule samples repeated) for
scale. Pure Python: no database.

    .venv/bin/python bench/diagnosis_adversarial.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.diagnosis import wording  # noqa: E402
from console.diagnosis.matcher import diagnose  # noqa: E402
from tests.console.diagnosis.adversarial import text_of  # noqa: E402
from tests.console.diagnosis.samples import error_samples, log_text  # noqa: E402

SIZE = 5 * 1024 * 1024
TARGET_S = 2.0


def wording_lines(size: int) -> str:
    """Failure lines of the words the wording model weighs (not words a rule reads: the guess
    runs only when no rule names a cause), each line a full 4 KB piece."""
    words = [w for w in wording.model().log_word if w.isalpha()]
    line = ("failed " + " ".join(words))[:4096]
    return "\n".join([line] * (size // 4097 + 1))[:size]


def shapes() -> dict[str, str]:
    benign = "\n".join(log_text(p) for p in error_samples())
    return {
        "one 5 MB line of '/health: no answer: '": ("/health: no answer: " * (SIZE // 20))[:SIZE],
        "300 KB lines of the rules' keywords": text_of(SIZE, 300 * 1024),
        "120-char lines of the rules' keywords": text_of(SIZE, 120),
        "4 KB lines of the wording model's words": wording_lines(SIZE),
        "benign: the rule samples repeated": (benign * (SIZE // len(benign) + 1))[:SIZE],
    }


def main() -> int:
    diagnose("warm up")
    worst = 0.0
    for name, text in shapes().items():
        start = time.perf_counter()
        found = diagnose(text)
        took = time.perf_counter() - start
        worst = max(worst, took)
        top = found[0].category if found else "(nothing)"
        print(f"{name:42s} {len(text) / 1e6:5.2f} MB  {took:6.2f} s  top: {top}")
    lines = list(enumerate(wording_lines(wording.MAX_CHARS * 2).splitlines(), start=1))
    start = time.perf_counter()
    guess = wording.closest(lines, symptom="engine-crash")
    took = time.perf_counter() - start
    worst = max(worst, took)
    print(
        f"{'the guess alone, its largest input':42s} {sum(len(t) for _, t in lines) / 1e6:5.2f} MB"
        f"  {took:6.2f} s  top: {guess.category if guess else '(no guess)'}"
    )
    print(
        f"worst {worst:.2f} s (target <= {TARGET_S:g} s): {'met' if worst <= TARGET_S else 'NOT met'}"
    )
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
