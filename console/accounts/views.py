"""Account pages: sign-in/out, API tokens, the audit log."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.contrib.auth import update_session_auth_hash
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import PasswordChangeForm
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from console.accounts import services, throttle
from console.accounts.decorators import role_required
from console.accounts.middleware import MUST_CHANGE_KEY
from console.accounts.models import AuditEntry, TokenScope
from console.deployments.models import Deployment
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
        # suggestions for the models field: what the gateway serves
        "served_models": Deployment.objects.order_by("served_model_name")
        .values_list("served_model_name", flat=True)
        .distinct(),
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
        request.session["new_token"] = {  # shown once by the tokens page, then dropped
            "name": token.name,
            "value": raw,
            "models": token.allowed_models,
            "expires": f"{token.expires_at:%Y-%m-%d}" if token.expires_at else "",
        }
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


class NewPasswordForm(PasswordChangeForm):
    """Django's form (old password, the new one twice, the password validators) that also
    refuses the old password as the new one."""

    def clean(self):
        cleaned = super().clean()
        new = cleaned.get("new_password1")
        if new and not self.has_error("new_password2") and self.user.check_password(new):
            self.add_error(
                "new_password1", forms.ValidationError("choose one different from the current one")
            )
        return cleaned


class PasswordChangeView(auth_views.PasswordChangeView):
    """Change one's own password (services.change_password: audited, lifts a must-change).
    Every signed-in user may; the generated first admin is sent here until done
    (accounts/middleware.py)."""

    template_name = "accounts/password_change.html"
    form_class = NewPasswordForm

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        request = self.request
        context["required"] = bool(request.session.get(MUST_CHANGE_KEY))
        context["next"] = request.POST.get("next") or request.GET.get("next", "")
        return context

    def form_valid(self, form):
        request = self.request
        services.change_password(
            actor=services.actor_from_request(request),
            user=form.user,
            new_password=form.cleaned_data["new_password1"],
        )
        update_session_auth_hash(request, form.user)
        request.session[MUST_CHANGE_KEY] = False
        messages.success(request, "Password changed.")
        target = request.POST.get("next", "")
        safe = url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        )
        return redirect(target if safe else "dashboard")
