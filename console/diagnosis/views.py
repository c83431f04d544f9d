"""Diagnosis pages: paste or upload a log and get "what happened, what to do now"; the rules."""

from __future__ import annotations

import asyncio

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.shortcuts import render

from console.accounts.decorators import role_required
from console.diagnosis import faultcodes, services
from console.diagnosis.codes import codebook
from console.diagnosis.rulebook import HEALTH_VALUES, knowledge, rulebook
from console.errors import Invalid


def _form_input(request) -> tuple[dict, str | None]:
    """The submitted log (file upload wins over the textarea) and optional exit code/health,
    and what was left out of an uploaded file too big to read whole (services.excerpt)."""
    upload = request.FILES.get("file")
    if upload is not None:
        if upload.size > services.MAX_UPLOAD_BYTES:
            raise Invalid("text: the file is larger than 32 MB; upload its end", field="text")
        text, note = services.excerpt(services.decode_log(upload.read()))
    else:
        text, note = request.POST.get("text", ""), None
    raw_exit = request.POST.get("exit_code", "").strip()
    try:
        exit_code = int(raw_exit) if raw_exit else None
    except ValueError:
        raise Invalid("exit code: a whole number, e.g. 137", field="exit_code") from None
    health = request.POST.get("health") or None
    return {"text": text, "exit_code": exit_code, "health": health}, note


@role_required("viewer")
async def diagnose_page(request):
    """GET: the form. POST: run the matcher and show the result (the `result` partial for
    htmx). Stores nothing. Async: the matcher runs in a thread of its own, within
    services.TIME_LIMIT_S, never in the one thread all synchronous views share."""
    context = {"health_values": HEALTH_VALUES, "submitted": request.method == "POST"}
    if request.method == "POST":
        try:
            values, context["note"] = await sync_to_async(_form_input)(request)
            context.update(values)
            found = await asyncio.to_thread(services.diagnose_text, **values)
            context["diagnoses"] = [d.as_dict() for d in found]
        except RequestDataTooBig:
            context["error"] = "The log is larger than the server accepts; upload it as a file."
        except Invalid as exc:
            context["error"], context["error_field"] = exc.message, exc.field
    template = "diagnosis/diagnose.html#result" if request.htmx else "diagnosis/diagnose.html"
    return await sync_to_async(render)(request, template, context)


@role_required("viewer")
def rules_page(request):
    """The knowledge base: every rule, the categories, checked folklore and fault-code levels."""
    book = rulebook()
    code = request.GET.get("code", "").strip()[:40]  # DRV_ERROR_RESOURCE_OCCUPIED is 27
    context = {
        "code_query": code,
        "code_entry": _look_up(code),
        "codes_known": len(codebook()),
        "rules": [compiled.rule for compiled in book.rules],
        "categories": sorted(book.categories.items()),
        "knowledge": knowledge(),
        "levels": faultcodes.levels_table(),
        "catalogue_source": faultcodes.catalogue_source(),
    }
    return render(request, "diagnosis/rules.html", context)


def _look_up(code: str) -> dict | None:
    """The rules page's code box: an Ascend error code from the published tables, or a chip
    fault code (8 hex digits) with its handling level."""
    if not code:
        return None
    entry = codebook().lookup(code)
    if entry is not None:
        return entry.as_dict()
    try:
        level = faultcodes.fault_level(code)
    except ValueError:
        return None
    return {"fault": level} if level.get("known") else None
