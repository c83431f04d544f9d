"""Incident webhook pages: the endpoint list (everyone masked), create/edit/disable/delete and
"Send test" (admin). Thin adapters over console.diagnosis.webhook_services."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.accounts.decorators import role_required
from console.accounts.services import actor_from_request
from console.diagnosis import webhook_services as services
from console.diagnosis.models import Severity
from console.errors import DomainError

TEMPLATE = "diagnosis/webhooks.html"


def _int(value: str | None, default: int) -> int:
    try:
        return int(value or default)
    except ValueError:
        return -1  # the service refuses it, naming the field


def _fields(post) -> dict:
    return {
        "name": post.get("name", ""),
        "url": post.get("url", ""),
        "secret": post.get("secret", ""),
        "enabled": post.get("enabled") == "on",
        "min_severity": post.get("min_severity", Severity.WARNING),
        "renotify_minutes": _int(post.get("renotify_minutes"), 30),
    }


@role_required("viewer")
def webhook_list(request):
    context = {
        "endpoints": services.shown_endpoints(),
        "created": request.session.pop("new_webhook", None),  # its secret, shown once
        "severities": Severity.choices,
    }
    return render(request, TEMPLATE, context)


@require_POST
@role_required("admin")
def webhook_create(request):
    try:
        endpoint = services.create_endpoint(
            actor=actor_from_request(request), **_fields(request.POST)
        )
        request.session["new_webhook"] = {"name": endpoint.name, "secret": endpoint.secret}
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("webhook-list")


@role_required("admin")
def webhook_edit(request, webhook_id: int):
    try:
        endpoint = services.get_endpoint(webhook_id)
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("webhook-list")
    if request.method == "POST":
        try:
            services.update_endpoint(
                actor=actor_from_request(request), endpoint_id=webhook_id, **_fields(request.POST)
            )
            messages.success(request, f"webhook {request.POST.get('name', '')} saved")
            return redirect("webhook-list")
        except DomainError as exc:
            messages.error(request, exc.message)
    context = {"e": services.shown(endpoint), "severities": Severity.choices}
    return render(request, "diagnosis/webhook_edit.html", context)


@require_POST
@role_required("admin")
def webhook_toggle(request, webhook_id: int):
    try:
        endpoint = services.get_endpoint(webhook_id)
        services.update_endpoint(
            actor=actor_from_request(request), endpoint_id=webhook_id, enabled=not endpoint.enabled
        )
        messages.success(
            request, f"webhook {endpoint.name} {'disabled' if endpoint.enabled else 'enabled'}"
        )
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("webhook-list")


@require_POST
@role_required("admin")
def webhook_delete(request, webhook_id: int):
    try:
        services.delete_endpoint(actor=actor_from_request(request), endpoint_id=webhook_id)
        messages.success(request, "webhook deleted")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("webhook-list")


@require_POST
@role_required("admin")
def webhook_test(request, webhook_id: int):
    """Deliver a test payload now; for htmx the endpoint's row, with the receiver's answer."""
    try:
        result = services.send_test(actor=actor_from_request(request), endpoint_id=webhook_id)
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("webhook-list")
    if not request.htmx:
        text = f"test sent: {result.words}"
        (messages.success if result.ok else messages.error)(request, text)
        return redirect("webhook-list")
    endpoint = services.get_endpoint(webhook_id)
    context = {"e": services.shown(endpoint), "result": result}
    return render(request, f"{TEMPLATE}#row", context)
