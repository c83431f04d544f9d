"""Catalog pages: models x cards (fits or why not), and the deployment form prefilled from a
preset. Separate from views.py only to keep each module small; same conventions."""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.accounts.decorators import role_required
from console.deployments import catalog
from console.deployments.forms import engine_rows
from console.deployments.views import _form_context
from console.errors import DomainError


@role_required("viewer")
def catalog_page(request):
    cat = catalog.load_catalog()
    rows = [
        {"model": m, "presets": [catalog.preset_out(m, c) for c in cat.cards.values()]}
        for m in cat.models.values()
    ]
    return render(request, "deployments/catalog.html", {"cards": cat.cards.values(), "rows": rows})


def _initial(spec: dict) -> dict:
    """Spec values as the form's fields hold them (a checkbox: "on" or empty)."""
    import shlex

    initial = {k: "" if v is None else v for k, v in spec.items()}
    initial["extra_args"] = shlex.join(spec.get("extra_args") or [])
    for key, value in spec.items():  # checkboxes: enforce_eager, enable_expert_parallel
        if isinstance(value, bool):
            initial[key] = "on" if value else ""
    return initial


@require_GET
@role_required("operator")
def deployment_from_catalog(request):
    """The deployment form with a catalog preset's values (htmx swaps in just the form).

    GET ?model=<id>&card=<id>. Unknown ids or a preset that does not fit re-render the form
    with the reason instead of values (status 422), never a 500."""
    context = _form_context(request)
    model_id, card_id = request.GET.get("model", ""), request.GET.get("card", "")
    context.update(picked_model=model_id, picked_card=card_id)
    status = 200
    try:
        model, card = catalog.get_model(model_id), catalog.get_card(card_id)
        context["post"] = _initial(catalog.preset_spec(model, card))
        context["engine_rows"] = engine_rows(context["post"])
        context["preset"] = catalog.preset_out(model, card)
    except DomainError as exc:
        context["catalog_error"], status = exc, 422
    return render(request, "deployments/form.html", context, status=status)
