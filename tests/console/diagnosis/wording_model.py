"""Build console/diagnosis/data/wording-model.json from the development split of the corpus.

    .venv/bin/python -m tests.console.diagnosis.wording_model

Development logs only (the corpus's split, tests/console/diagnosis/corpus.py): the test split
measures the model and is never counted into it. test_wording.py rebuilds the model and fails
when the shipped file differs (a log added to the corpus without a rebuild, or a test log in it).
"""

from __future__ import annotations

import json

from console.diagnosis import wording
from console.diagnosis.matcher import pieces
from tests.console.diagnosis.corpus import Log, all_logs


def failure_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of the failure lines the matcher hands the guess for this log."""
    return wording.take((n, line) for n, line in pieces(text) if wording.is_failure_line(line))


def failure_words(text: str) -> set[str]:
    """The words the model counts for this log: those of its failure lines."""
    return wording.log_tokens(line for _, line in failure_lines(text))


def development_logs() -> list[Log]:
    return [log for log in all_logs() if log.split == "dev"]


def build(logs: list[Log] | None = None) -> dict:
    logs = development_logs() if logs is None else logs
    counts = wording.train((failure_words(log.text()), log.label) for log in logs)
    return {
        "built_from": (
            f"the failure lines of {len(logs)} development logs of tests/fixtures/corpus "
            "(python -m tests.console.diagnosis.wording_model)"
        ),
        **counts,
    }


def serialise(model: dict) -> str:
    return json.dumps(model, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"


if __name__ == "__main__":
    wording.MODEL_FILE.write_text(serialise(build()), encoding="utf-8")
    print(f"wrote {wording.MODEL_FILE}")
