"""Ship engine log lines to the console (task `console.log_lines`), agent side.

A thread that every `interval_s` scans `<state_dir>/engines/*/gen*-run*.log`, reads the bytes
written since its last visit, cuts them into complete lines (a partial last line waits for its
newline), masks secrets and sends batches in order. It only reads: the engine writes its own
file descriptor (see logs.py), so a slow or absent console never blocks an engine.

Where it got to is kept per replica in `<state_dir>/engines/<id>/shipped.json`
(`{file: {"offset": logical byte offset, "line_no": lines shipped}}`), written after each sent
batch, so an agent restart resumes there: nothing lost, and a batch re-sent after a crash
between send and save is stored once by the console (unique line numbers).

Offsets are logs.py's logical offsets, so copy-truncate rotation keeps them valid (the rotated
copy is read first). A file cut below the offset some other way (or bytes rotated away before
they were read) continues from the oldest kept byte, and that batch says `gap: true`.

The console refuses what is over the contract's caps (workers/contracts.py), so the shipper
keeps under them itself: a line longer than LOG_LINE_MAX_CHARS is cut, visibly, to
`<start>… [cut 12345 bytes]` (the rest is in the file on the host, `host.log_tail` reads it),
and a batch holds at most BATCH_LINES lines and BATCH_BYTES bytes of UTF-8 text (half of
LOG_BATCH_MAX_CHARS: a character is at least one byte).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from workers.contracts import (
    LOG_BATCH_MAX_CHARS,
    LOG_BATCH_MAX_LINES,
    LOG_LINE_MAX_CHARS,
    LogBatch,
    clip,
)
from workers.engine import logs

log = logging.getLogger("workers.shipper")
STATE_FILE = "shipped.json"
BATCH_LINES = LOG_BATCH_MAX_LINES
BATCH_BYTES = 512 * 1024  # of text as sent; LogBatch allows LOG_BATCH_MAX_CHARS characters
assert BATCH_BYTES <= LOG_BATCH_MAX_CHARS
READ_BYTES = 512 * 1024
SCAN_MAX_BYTES = 16 * 1024 * 1024  # per file per scan, so one busy engine cannot starve others
_RUN_LOG = re.compile(r"^gen(\d+)-run(\d+)\.log$")

# No pattern crosses a newline: masking runs over a whole chunk of lines at once (fast).
_VALUE = r"""(\[[^\]\n]*\]|"[^"\n]*"|'[^'\n]*'|[^\s"',;\]}]+)"""
_SECRETS = [
    # Authorization: Bearer xxx / bare "Bearer xxx" / Authorization: Basic xxx
    (re.compile(r"(?i)\b(bearer[ \t]+)[A-Za-z0-9._~+/=-]+"), r"\1***"),
    (re.compile(r"(?i)(authorization[\"']?[ \t]*[:=][ \t]*basic[ \t]+)[A-Za-z0-9+/=]+"), r"\1***"),
    # --api-key X / --api-key=X / --api_key X / --hf-token X / --token X, and every further
    # value of a multi-value flag (vLLM's --api-key takes several: --api-key A B C)
    (
        re.compile(
            r"(?i)(--(?:api[-_]key|hf[-_]token|token|password)(?:=|[ \t]+))"
            + _VALUE
            + r"((?:[ \t]+(?!-)"
            + _VALUE
            + r")*)"
        ),
        lambda m: m.group(1) + "***" + re.sub(r"[^ \t]+", "***", m.group(3)),
    ),
    # NAME_TOKEN=..., NAME_SECRET: ..., PASSWORD=..., api_key=..., token=..., "api_key": "...",
    # 'api_key': ['a', 'b'] (vLLM's "non-default args" dump), api_key=['a'] (a Namespace)
    (
        re.compile(
            r"(?i)((?:_TOKEN|\btoken|_SECRET|PASSWORD|api[_-]?key|_KEY)[\"']?[ \t]*[=:][ \t]*)"
            + _VALUE
        ),
        r"\1***",
    ),
    # a password in a URL: redis://user:pw@host
    (re.compile(r"(://[^/:@\s]*:)[^/@\s]+@"), r"\1***@"),
    # well-known key shapes anywhere: OpenAI-style sk-..., Hugging Face hf_...
    (re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"), "***"),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), "***"),
]


# every secret pattern above contains one of these (lowercase): lines without any are skipped
_NEEDLES = re.compile(
    r"bearer|authorization|--api|--hf|--token|--password|token|_secret|password|api.?key|_key|sk-|hf_|://"
)


# Terminal control sequences an engine (or a hostile host) may write: CSI (colours, cursor
# moves; ESC [ or the 8-bit 0x9b), the string sequences OSC (ESC ], 0x9d: hyperlinks OSC 8,
# clipboard writes OSC 52, window titles), DCS, SOS, PM and APC up to BEL or ST, and the other
# ESC sequences. Removed whole, payload included, before any text is stored or shown (ECMA-48
# section 5 for the shapes). A string sequence never runs past the end of its line.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
)
# What is left of C0 (but tab and newline), DEL, C1, and the bidirectional overrides that make
# a page show text in another order than it is stored.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _after_carriage_return(line: str) -> str:
    """What a terminal shows of a line rewritten with carriage returns (progress bars): its
    last non-empty part."""
    parts = [part for part in line.split("\r") if part]
    return parts[-1] if parts else ""


def strip_controls(text: str) -> str:
    """The text (one line or many) without terminal control sequences or control characters:
    escape sequences removed whole (an OSC 52 clipboard write or OSC 8 link with its payload),
    every other C0/C1 control removed, tab and newline kept, a line rewritten with carriage
    returns reduced to what a terminal would show. Never adds or removes a newline. Ordinary
    lines are returned as they are (one search)."""
    if not _CONTROLS.search(text):
        return text
    text = _ESCAPES.sub("", text)
    if "\r" in text:
        text = "\n".join(_after_carriage_return(line) for line in text.split("\n"))
    return _CONTROLS.sub("", text)


def _mask_line(line: str) -> str:
    for pattern, repl in _SECRETS:
        line = pattern.sub(repl, line)
    return line


def mask_secrets(text: str) -> str:
    """The text (one line or many) as it may be stored or shown: terminal controls removed
    (strip_controls: first, as a colour code inside a token would hide it from the patterns),
    then token, password and API-key values replaced by `***`. Every path that keeps or shows
    a host's text calls this (the shipper, the console's log intake, masking.shown_lines for
    log tails and incident evidence). Never adds or removes a newline. Fast on ordinary logs:
    only lines holding a telltale word go through the patterns."""
    text = strip_controls(text)
    low = text.lower()
    if not _NEEDLES.search(low):
        return text
    lines, lows = text.split("\n"), low.split("\n")
    for i, lowered in enumerate(lows):
        if _NEEDLES.search(lowered):
            lines[i] = _mask_line(lines[i])
    return "\n".join(lines)


def _read_bytes(path: Path, offset: int, max_bytes: int) -> tuple[bytes, int, bool]:
    """Raw bytes from logical `offset` (logs.read_log's rules, without decoding):
    (data, where data starts, whether bytes before it were lost). Raises OSError when the
    file cannot be read."""
    with logs._lock(path):
        base, size = logs._read_base(path), path.stat().st_size
        rotated = logs.rotated_path(path)
        kept_from = base - logs._size(rotated) if base else base
        lost = offset < kept_from or offset > base + size
        if lost:
            offset = kept_from
        data = b""
        if offset < base:  # older bytes in the rotated copy, then on into the file
            with open(rotated, "rb") as fh:
                fh.seek(offset - kept_from)
                data = fh.read(min(max_bytes, base - offset))
        if len(data) < max_bytes:
            with open(path, "rb") as fh:
                fh.seek(max(0, offset - base))
                data += fh.read(max_bytes - len(data))
        return data, offset, lost


def fit_line(text: str) -> str:
    """A masked line as shipped: at most LOG_LINE_MAX_CHARS characters, a longer one cut with
    a visible `… [cut N bytes]` marker (never refused by the console, never cut silently)."""
    return clip(text, LOG_LINE_MAX_CHARS)


class _Batches:
    """Collects masked lines and sends them as batches of at most BATCH_LINES lines and
    BATCH_BYTES bytes of text (each line counted as its UTF-8 size plus one)."""

    def __init__(self, ship: Callable[[list[str], bool], None]) -> None:
        self.ship, self.lines, self.size, self.gap = ship, [], 0, False

    def add(self, line: str, size: int) -> None:
        if self.lines and (len(self.lines) >= BATCH_LINES or self.size + size > BATCH_BYTES):
            self.flush()
        self.lines.append(line)
        self.size += size

    def flush(self) -> None:
        if self.lines:
            self.ship(self.lines, self.gap)
            self.lines, self.size, self.gap = [], 0, False


class LogShipper:
    """Scans engine logs and sends new lines through `send(payload dict)`.

    `send` is called with a LogBatch dump; it may raise (the batch is retried next scan).
    """

    def __init__(
        self,
        state_dir: Path | str,
        node: str,
        send: Callable[[dict], None],
        interval_s: float = 0.5,
        stop: threading.Event | None = None,
    ) -> None:
        self.root = Path(state_dir) / "engines"
        self.node = node
        self.send = send
        self.interval_s = interval_s
        self.stop = stop or threading.Event()
        self.errors: dict[str, str] = {}  # file -> last read error (reported once per change)

    # --- state ---------------------------------------------------------------------------
    @staticmethod
    def load_state(directory: Path) -> dict[str, dict[str, int]]:
        try:
            data = json.loads((directory / STATE_FILE).read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    @staticmethod
    def save_state(directory: Path, state: dict[str, dict[str, int]]) -> None:
        """Atomically; a failure (disk full) is logged: the lines were sent, and re-sending
        them after a restart is harmless (the console stores each line once)."""
        tmp = directory / (STATE_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps(state, sort_keys=True))
            os.replace(tmp, directory / STATE_FILE)
        except OSError as exc:
            log.error("cannot save %s: %s", directory / STATE_FILE, exc)

    # --- scanning ------------------------------------------------------------------------
    def run(self) -> None:
        """Scan until `stop` is set; never raises."""
        while not self.stop.is_set():
            try:
                self.scan_once()
            except Exception:  # noqa: BLE001 - shipping must outlive any one bad scan
                log.exception("log shipping scan failed; retrying")
            self.stop.wait(self.interval_s)

    def scan_once(self) -> int:
        """Ship what is new in every run log. Returns the number of lines sent."""
        sent = 0
        if not self.root.is_dir():
            return 0
        for directory in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if not directory.name.isdigit():
                continue
            files = logs.run_logs(directory)
            state = self.load_state(directory)
            for gone in set(state) - {p.name for p in files}:
                del state[gone]  # pruned run logs
            for path in files:
                try:
                    sent += self._ship_file(directory, path, state, last=path == files[-1])
                except Exception as exc:  # noqa: BLE001 - e.g. the broker is down: retry later
                    self._report(path, f"cannot ship {path.name}: {exc}")
                    break  # this replica's later runs wait, to keep their order
        return sent

    def _ship_file(self, directory: Path, path: Path, state: dict, last: bool) -> int:
        entry = state.setdefault(path.name, {"offset": 0, "line_no": 0})
        sent = 0
        scanned = 0
        while scanned < SCAN_MAX_BYTES:
            try:
                data, start, lost = _read_bytes(path, entry["offset"], READ_BYTES)
            except OSError as exc:
                self._report(path, f"cannot read {path}: {exc}")
                return sent
            self.errors.pop(str(path), None)
            lines, consumed = self._split(data, full=len(data) >= READ_BYTES, last=last)
            if not lines and not lost:
                break
            sent += self._send_lines(directory, path, state, lines, start, consumed, lost)
            scanned += max(consumed, 1)
            if consumed == 0:
                break
        return sent

    @staticmethod
    def _split(data: bytes, *, full: bool, last: bool) -> tuple[list[tuple[int, str]], int]:
        """Complete lines of `data` as (raw byte length, masked text), and the bytes they use.
        A partial last line waits for its newline, unless the chunk holds no newline and is
        full (one huge line: cut) or the run is over (it will never be finished)."""
        end = data.rfind(b"\n") + 1
        if (end == 0 and data and (full or not last)) or (end and not last and not full):
            end = len(data)
        chunk = data[:end]
        sizes = [len(raw) + 1 for raw in chunk.split(b"\n")]
        sizes[-1] -= 1  # the last part has no newline (empty when the chunk ends with one)
        texts = mask_secrets(chunk.decode("utf-8", errors="replace")).split("\n")
        out = [(size, text.rstrip("\r")) for size, text in zip(sizes, texts, strict=True) if size]
        return out, end

    def _send_lines(self, directory, path, state, lines, start, consumed, lost) -> int:
        entry = state[path.name]
        match = _RUN_LOG.match(path.name)
        generation, run = int(match[1]), int(match[2])
        entry["offset"] = start
        pending: list[int] = []

        def ship(batch: list[str], gap: bool) -> None:
            payload = LogBatch(
                node=self.node,
                replica_id=int(directory.name),
                generation=generation,
                run=run,
                file=path.name,
                first_line_no=entry["line_no"] + 1,
                lines=batch,
                gap=gap,
                sent_at=datetime.now(UTC),
            )
            self.send(payload.model_dump(mode="json"))
            entry["line_no"] += len(batch)
            entry["offset"] += sum(pending[: len(batch)])
            del pending[: len(batch)]
            self.save_state(directory, state)

        batches = _Batches(ship)
        batches.gap = lost
        if lost:
            log.warning("%s: log cut below the shipped offset; continuing from %d", path, start)
        for size, line in lines:
            pending.append(size)  # raw bytes, for the offset
            line = fit_line(line)
            batches.add(line, len(line.encode("utf-8", "replace")) + 1)  # bytes as sent
        batches.flush()
        if lost and not lines:
            self.save_state(directory, state)
        return len(lines)

    def _report(self, path: Path, message: str) -> None:
        if self.errors.get(str(path)) != message:
            self.errors[str(path)] = message
            log.error("%s (will retry)", message)
