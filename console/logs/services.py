"""Log lines: ingest a shipped batch, read pages of a run, purge past retention."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from django.db import transaction
from django.db.models import Max
from django.db.models.functions import Length
from django.utils import timezone

from console.deployments.models import Replica
from console.errors import Invalid, NotFound
from console.logs.models import Level, LogLine, parse_level, run_key
from workers.contracts import LogBatch
from workers.engine.shipper import mask_secrets, strip_controls

log = logging.getLogger("console.logs")
KEEP_LINES = 10_000
KEEP_BYTES = 5 * 1024 * 1024
PAGE_MAX = 1000
_RUN = re.compile(r"^gen(\d+)-run(\d+)(?:-rank(\d+))?$")
LEVELS = {"error", "warning", "info", "debug"}


def ingest_batch(*, payload: dict) -> int:
    """Store a shipped batch. Idempotent: a line already stored (same replica, run, line
    number) is skipped. Lines are cleaned again here (mask_secrets: terminal escape sequences
    and control characters removed, secrets masked), so neither reaches the database even
    from an old or hostile agent. Returns the number of lines in the batch (0 when dropped)."""
    batch = LogBatch.model_validate(payload)
    replica = Replica.objects.select_related("node").filter(pk=batch.replica_id).first()
    if replica is None:
        return 0  # deleted since: nothing to keep
    member = replica.members.filter(node__name=batch.node).values_list("rank", flat=True).first()
    if member is None and replica.node is not None and replica.node.name != batch.node:
        log.warning("log batch for replica %s from %s ignored", replica.pk, batch.node)
        return 0
    now = timezone.now()
    rows = []
    for i, raw in enumerate(batch.lines):
        text = mask_secrets(raw)
        rows.append(
            LogLine(
                replica=replica,
                generation=batch.generation,
                run=batch.run,
                member=member or 0,
                line_no=batch.first_line_no + i,
                text=text,
                level=parse_level(text),
                gap_before=batch.gap and i == 0,
                at=now,
            )
        )
    LogLine.objects.bulk_create(rows, ignore_conflicts=True, batch_size=500)
    return len(rows)


class Run(NamedTuple):
    """One run's lines: of one generation, one start of it, one member (0: the leader, or the
    only host)."""

    generation: int
    run: int
    member: int = 0

    def lines(self, replica: Replica):
        return LogLine.objects.filter(
            replica=replica, generation=self.generation, run=self.run, member=self.member
        )


def runs_of(*, replica: Replica) -> list[str]:
    """The replica's runs that have lines, newest first (each member's of a group apart)."""
    triples = (
        LogLine.objects.filter(replica=replica)
        .values_list("generation", "run", "member")
        .distinct()
        .order_by("-generation", "-run", "member")
    )
    return [run_key(g, r, m) for g, r, m in triples]


def parse_run(value: str | None, runs: list[str]) -> Run | None:
    """The run `value` names (default: the newest run); None when there are no lines."""
    value = value or (runs[0] if runs else None)
    if value is None:
        return None
    match = _RUN.match(value)
    if not match:
        raise Invalid("run must look like gen<g>-run<n> (or gen<g>-run<n>-rank<m>)", field="run")
    return Run(int(match[1]), int(match[2]), int(match[3] or 0))


def parse_cursor(value: str | None, field: str = "after") -> int:
    if value in (None, ""):
        return 0
    if not value.isdigit() or len(value) > 12:
        raise Invalid(f"{field} must be a cursor returned by this API", field=field)
    return int(value)


@dataclass
class Page:
    lines: list[LogLine]
    next_cursor: str
    runs: list[str]
    run: str | None


def read_page(
    *,
    replica: Replica,
    run: str | None = None,
    after: str | None = None,
    limit: int = 500,
    q: str = "",
    level: str = "",
) -> Page:
    """Lines of one run after the cursor, oldest first. The cursor is the last line number
    seen; when nothing new matches it stays where it was (a tail polls with it)."""
    if level and level not in LEVELS:
        raise Invalid("level must be one of error, warning, info, debug", field="level")
    if not 1 <= limit <= PAGE_MAX:
        raise Invalid(f"limit must be 1..{PAGE_MAX}", field="limit")
    cursor = parse_cursor(after)
    runs = runs_of(replica=replica)
    chosen = parse_run(run, runs)
    if chosen is None:
        return Page([], str(cursor), runs, None)
    lines = chosen.lines(replica).filter(line_no__gt=cursor)
    if q:
        lines = lines.filter(text__icontains=q)
    if level:
        lines = lines.filter(level=level)
    found = list(lines.order_by("line_no")[:limit])
    for line in found:  # rows stored before intake stripped them (0.3) are shown clean too
        line.text = strip_controls(line.text)
    next_cursor = str(found[-1].line_no if found else cursor)
    return Page(found, next_cursor, runs, run_key(*chosen))


def first_error(*, replica: Replica, run: Run) -> int | None:
    return (
        run.lines(replica)
        .filter(level=Level.ERROR)
        .order_by("line_no")
        .values_list("line_no", flat=True)
        .first()
    )


def last_line_no(*, replica: Replica, run: Run) -> int:
    return run.lines(replica).aggregate(top=Max("line_no"))["top"] or 0


def iter_text(*, replica: Replica, run: Run) -> Iterator[str]:
    """The run's lines as the download's text, without terminal controls (a downloaded log
    read with `cat` or `less -R` must not set a title, a link or the clipboard)."""
    lines = run.lines(replica)
    for text in lines.order_by("line_no").values_list("text", flat=True).iterator(2000):
        yield strip_controls(text) + "\n"


def get_replica(replica_id: int) -> Replica:
    replica = Replica.objects.filter(pk=replica_id).first()
    if replica is None:
        raise NotFound(f"replica {replica_id} not found")
    return replica


def _cutoff(lines) -> int | None:
    """The lowest line number to keep: the last KEEP_LINES lines, or more while they fit in
    KEEP_BYTES. None when everything is kept."""
    count = size = 0
    cutoff = None
    for line_no, length in lines.order_by("-line_no").values_list("line_no", "length"):
        count += 1
        size += length + 1
        if count > KEEP_LINES and size > KEEP_BYTES:
            return cutoff
        cutoff = line_no
    return None


def purge_logs() -> int:
    """Delete lines past retention, per replica run. Returns the number deleted."""
    deleted = 0
    runs = LogLine.objects.values_list("replica_id", "generation", "run", "member").distinct()
    for replica_id, generation, run, member in list(runs):
        lines = LogLine.objects.filter(
            replica_id=replica_id, generation=generation, run=run, member=member
        )
        if lines.count() <= KEEP_LINES:
            continue
        cutoff = _cutoff(lines.annotate(length=Length("text")))
        if cutoff is not None:
            with transaction.atomic():
                deleted += lines.filter(line_no__lt=cutoff).delete()[0]
    return deleted
