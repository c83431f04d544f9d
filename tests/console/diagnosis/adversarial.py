"""Hostile log text built from the rule base's own words: what makes a backtracking engine
explode (long lines of near-matches) is what the matcher must read in linear time."""

from __future__ import annotations

import re

from console.diagnosis.rulebook import rulebook

SEPARATORS = (": ", " ", "=", "/", "(", ", ")


def keywords() -> list[str]:
    """The literal words of every rule regex and a few recogniser shapes."""
    words: set[str] = set()
    for rule in rulebook().rules:
        for pattern in (*rule.line_regexes, *rule.requires):
            words.update(w for w in re.split(r"[^A-Za-z0-9_]+", pattern) if len(w) >= 3)
    words.update(["Traceback", "Error", "RuntimeError", "EZ9999", "error code", "507035", "-8005"])
    return sorted(words)


def line_of(size: int, offset: int = 0) -> str:
    """One line of about `size` characters: the keywords in turn, with separators between."""
    words = keywords()
    parts, total, i = [], 0, offset
    while total < size:
        part = words[i % len(words)] + SEPARATORS[i % len(SEPARATORS)]
        parts.append(part)
        total += len(part)
        i += 1
    return "".join(parts)[:size]


def text_of(size: int, line_size: int) -> str:
    lines, total, k = [], 0, 0
    while total < size:
        line = line_of(min(line_size, size - total), offset=k)
        lines.append(line)
        total += len(line) + 1
        k += 7
    return "\n".join(lines)
