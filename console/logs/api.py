"""`/api/v1/replicas/{id}/logs`: a run's shipped lines by cursor, and the whole run as text."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from ninja import Router

from console.errors import NotFound
from console.logs import services
from console.logs.models import run_key
from console.logs.schemas import LogPageOut

router = Router(tags=["logs"])


@router.get("/replicas/{replica_id}/logs", response=LogPageOut)
def replica_logs(
    request,
    replica_id: int,
    run: str | None = None,
    after: str | None = None,
    limit: int = 500,
    q: str = "",
    level: str = "",
):
    """Lines after the cursor (`after` = a `next_cursor`), oldest first. `run` is one of
    `runs` (default the newest, i.e. the current restart)."""
    replica = services.get_replica(replica_id)
    page = services.read_page(replica=replica, run=run, after=after, limit=limit, q=q, level=level)
    lines = [
        {
            "cursor": str(line.line_no),
            "line_no": line.line_no,
            "text": line.text,
            "level": line.level,
            "at": line.at,
            "gap_before": line.gap_before,
        }
        for line in page.lines
    ]
    return {"lines": lines, "next_cursor": page.next_cursor, "run": page.run, "runs": page.runs}


@router.get("/replicas/{replica_id}/logs/download")
def replica_logs_download(request, replica_id: int, run: str | None = None):
    """The run's stored lines as a text/plain attachment."""
    replica = services.get_replica(replica_id)
    chosen = services.parse_run(run, services.runs_of(replica=replica))
    if chosen is None:
        raise NotFound(f"replica {replica_id} has no shipped log lines")
    response = StreamingHttpResponse(
        services.iter_text(replica=replica, run=chosen),
        content_type="text/plain; charset=utf-8",
    )
    name = f"replica-{replica.pk}-{run_key(*chosen)}.log"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
