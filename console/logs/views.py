"""The live tail of a replica's shipped log: one page, one poll partial (htmx)."""

from __future__ import annotations

from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.urls import reverse

from console.accounts.decorators import role_required
from console.deployments.models import Replica
from console.errors import DomainError
from console.logs import services

INITIAL_LINES = 500


def _filters(request) -> dict:
    return {
        "q": request.GET.get("q", "").strip()[:200],
        "level": request.GET.get("level", ""),
        "run": request.GET.get("run") or None,
    }


@role_required("viewer")
def replica_logs(request, replica_id: int):
    """Full page: the last lines of a run (or from `start`, e.g. the first error), a run
    selector and filters. htmx poll (`after` set): only the lines after the cursor."""
    replica = get_object_or_404(Replica.objects.select_related("deployment", "node"), pk=replica_id)
    filters = _filters(request)
    try:
        if request.htmx and "after" in request.GET:
            page = services.read_page(replica=replica, after=request.GET["after"], **filters)
            return render(request, "logs/replica.html#poll", _context(replica, page, filters))
        page = _initial_page(replica, request.GET.get("start"), filters)
    except DomainError as exc:
        raise Http404(exc.message) from exc
    return render(request, "logs/replica.html", _context(replica, page, filters))


def _initial_page(replica: Replica, start: str | None, filters: dict) -> services.Page:
    page = services.read_page(replica=replica, limit=1, **filters)  # which run, which runs
    if page.run is None:
        return page
    run = services.parse_run(page.run, page.runs)
    if start:
        after = str(max(0, services.parse_cursor(start, "start") - 1))
    elif filters["q"] or filters["level"]:
        after = "0"  # the first matches of the run
    else:
        top = services.last_line_no(replica=replica, run=run)
        after = str(max(0, top - INITIAL_LINES))
    return services.read_page(replica=replica, after=after, limit=services.PAGE_MAX, **filters)


def _context(replica: Replica, page: services.Page, filters: dict) -> dict:
    context = {"replica": replica, "page": page, "filters": filters, "first_error": None}
    if page.run:
        context["first_error"] = services.first_error(
            replica=replica, run=services.parse_run(page.run, page.runs)
        )
        context["download"] = (
            reverse("api:replica_logs_download", args=[replica.pk]) + f"?run={page.run}"
        )
    context["levels"] = ["error", "warning", "info", "debug"]
    return context
