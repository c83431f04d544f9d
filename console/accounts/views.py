"""Account pages: sign-in/out, API tokens, the audit log."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from console.accounts import services
from console.accounts.decorators import role_required
from console.accounts.models import AuditEntry, TokenScope
from console.errors import DomainError

EXPIRY_CHOICES = {"7": 7, "30": 30, "90": 90, "365": 365, "never": None}


class LoginView(auth_views.LoginView):
    template_name = "accounts/login.html"
    redirect_authenticated_user = True


@role_required("viewer")
def tokens(request):
    created = request.session.pop("new_token", None)  # shown once, then gone
    context = {
        "tokens": services.tokens_visible_to(request.user),
        "created": created,
        "expiry_choices": EXPIRY_CHOICES,
    }
    return render(request, "accounts/tokens.html", context)


@require_POST
@role_required("viewer")
def token_create(request):
    actor = services.actor_from_request(request)
    scope = request.POST.get("scope", TokenScope.READ)
    days = EXPIRY_CHOICES.get(request.POST.get("expires", "90"), 90)
    try:
        if scope not in TokenScope.values:
            raise DomainError("scope must be read or write", field="scope")
        if scope == TokenScope.WRITE:
            services.check_role(actor, "operator")
        expires = timezone.now() + timedelta(days=days) if days else None
        token, raw = services.create_token(
            actor=actor, name=request.POST.get("name", ""), scope=scope, expires_at=expires
        )
        request.session["new_token"] = {"name": token.name, "value": raw}
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("tokens")


@require_POST
@role_required("viewer")
def token_revoke(request, token_id: int):
    try:
        token = services.revoke_token(actor=services.actor_from_request(request), token_id=token_id)
        messages.success(request, f"token {token.name} revoked")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("tokens")


@role_required("operator")
def audit(request):
    entries = AuditEntry.objects.all()
    if request.GET.get("action"):
        entries = entries.filter(action=request.GET["action"])
    return render(request, "accounts/audit.html", {"entries": entries[:200]})
