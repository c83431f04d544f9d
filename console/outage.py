"""The database is unreachable: answer 503 with a clean message, never a traceback.

Django closes a connection that raised (it checks `is_usable()` at the end of the request),
and CONN_HEALTH_CHECKS re-checks a kept connection before its first use in a request, so
once PostgreSQL answers again the next request simply reconnects: no restart needed.
"""

from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import server_error as django_server_error

DB_ERRORS = (OperationalError, InterfaceError)
RETRY_AFTER_S = 5
MESSAGE = "the console's database is unavailable; retry in a few seconds"
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Database unavailable · NPU Console</title>
<meta http-equiv="refresh" content="{retry}"></head>
<body><main><h1>Database unavailable</h1><p>The console cannot reach its database right now.
This page retries every {retry} seconds; engines keep serving meanwhile.</p></main></body></html>
"""


def unavailable(request: HttpRequest) -> HttpResponse:
    """503 for the database being down: JSON `{message, field}` under /api/, else a small
    self-contained page (no template context: the usual one reads the database)."""
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse({"message": MESSAGE, "field": None}, status=503)
    else:
        response = HttpResponse(_PAGE.format(retry=RETRY_AFTER_S), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def server_error(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """handler500: a database outage becomes 503 (see unavailable); anything else is Django's
    plain 500. Django calls this inside its `except` block, so sys.exc_info() is the error."""
    if isinstance(sys.exc_info()[1], DB_ERRORS):
        return unavailable(request)
    return django_server_error(request, *args, **kwargs)
