"""Account pages: sign-in/out, API tokens, the audit log."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from console.accounts import services, throttle
from console.accounts.decorators import role_required
from console.accounts.models import AuditEntry, TokenScope
from console.errors import DomainError

EXPIRY_CHOICES = {"7": 7, "30": 30, "90": 90, "365": 365, "never": None}


class LoginView(auth_views.LoginView):
    """Sign-in, rate-limited per account + address and per account (accounts/throttle.py)."""

    template_name = "accounts/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        wait = throttle.retry_after(username, services.client_addr(request))
        if wait is not None:
            minutes = max(1, -(-wait // 60))
            form = self.get_form()
            context = self.get_context_data(form=form, locked_minutes=minutes)
            response = self.render_to_response(context, status=429)
            response["Retry-After"] = str(wait)
            return response
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        request = self.request
        throttle.note_failure(request.POST.get("username", ""), services.client_addr(request))
        return super().form_invalid(form)

    def form_valid(self, form):
        throttle.clear(self.request.POST.get("username", ""), services.client_addr(self.request))
        return super().form_valid(form)


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
            actor=actor,
            name=request.POST.get("name", ""),
            scope=scope,
            expires_at=expires,
            allowed_models=request.POST.get("models", "").replace(",", " ").split(),
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
