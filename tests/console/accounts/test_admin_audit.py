"""Promise: user and role changes made through Django's admin site are in the audit log —
creation, field and role (group) changes, password changes, deletion one by one or in bulk,
a role's permissions, a token edited there — with the admin as the actor and never a
password or its hash. Driven through the real admin views."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from console.accounts.models import ApiToken, AuditEntry
from console.accounts.services import Actor, create_token
from tests.helpers import client_for, make_user

pytestmark = pytest.mark.django_db
User = get_user_model()


@pytest.fixture
def root():
    user = make_user("root", "admin")
    user.is_staff = user.is_superuser = True
    user.save(update_fields=["is_staff", "is_superuser"])
    return user


@pytest.fixture
def site(root):
    return client_for(root)


def entries(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action, via="admin").order_by("id"))


def change_form(user, **changes) -> dict:
    """The admin's user change form as a browser posts it, with `changes`."""
    data = {
        "username": user.username,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "email": user.email,
        "is_active": "on" if user.is_active else "",
        "is_staff": "on" if user.is_staff else "",
        "is_superuser": "on" if user.is_superuser else "",
        "groups": [g.pk for g in user.groups.all()],
        "user_permissions": [],
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
        "last_login_0": "",
        "last_login_1": "",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


def test_creating_a_user_and_giving_a_role_are_audited(site, root):
    resp = site.post(
        "/admin/auth/user/add/",
        {
            "username": "bob",
            "password1": "Correct-Horse-42",
            "password2": "Correct-Horse-42",
            "usable_password": "true",
        },
    )
    assert resp.status_code == 302, resp.content[:2000]
    bob = User.objects.get(username="bob")
    [created] = entries("user.create")
    assert created.user == root and created.actor == "root" and created.object_id == str(bob.pk)
    assert created.after["username"] == "bob" and created.after["roles"] == []
    assert created.after["password_usable"] is True

    operator = Group.objects.get(name="operator")
    resp = site.post(f"/admin/auth/user/{bob.pk}/change/", change_form(bob, groups=[operator.pk]))
    assert resp.status_code == 302, resp.content[:3000]
    [changed] = entries("user.change")
    assert changed.before == {"roles": []} and changed.after == {"roles": ["operator"]}

    resp = site.post(
        f"/admin/auth/user/{bob.pk}/change/",
        change_form(bob, groups=[operator.pk], is_staff="on", email="bob@example.org"),
    )
    assert resp.status_code == 302
    last = entries("user.change")[-1]
    assert last.before == {"email": "", "is_staff": False}
    assert last.after == {"email": "bob@example.org", "is_staff": True}


def test_a_password_set_in_the_admin_is_audited_without_it(site, root):
    bob = make_user("bob", "viewer")
    old_hash = bob.password
    resp = site.post(
        f"/admin/auth/user/{bob.pk}/password/",
        {
            "password1": "Another-Horse-43",
            "password2": "Another-Horse-43",
            "usable_password": "true",
        },
    )
    assert resp.status_code == 302, resp.content[:2000]
    [entry] = entries("user.password_change")
    assert entry.actor == "root" and entry.object_id == str(bob.pk)
    text = str([entry.message, entry.before, entry.after])
    assert "Another-Horse-43" not in text and old_hash not in text
    bob.refresh_from_db()
    assert bob.password not in text
    # a form that fails validation changes nothing and records nothing
    site.post(f"/admin/auth/user/{bob.pk}/password/", {"password1": "a", "password2": "b"})
    assert len(entries("user.password_change")) == 1


def test_deleting_users_one_or_many_is_audited(site):
    bob, eve, mal = (make_user(n, "viewer") for n in ("bob", "eve", "mal"))
    resp = site.post(f"/admin/auth/user/{bob.pk}/delete/", {"post": "yes"})
    assert resp.status_code == 302
    resp = site.post(
        "/admin/auth/user/",
        {"action": "delete_selected", "_selected_action": [eve.pk, mal.pk], "post": "yes"},
    )
    assert resp.status_code == 302
    deleted = entries("user.delete")
    assert [e.before["username"] for e in deleted] == ["bob", "eve", "mal"]
    assert deleted[0].before["roles"] == ["viewer"]
    assert not User.objects.filter(username__in=["bob", "eve", "mal"]).exists()


def test_a_roles_permissions_changed_in_the_admin_are_audited(site):
    viewer = Group.objects.get(name="viewer")
    perms = list(viewer.permissions.values_list("pk", flat=True))
    operate = Group.objects.get(name="operator").permissions.exclude(pk__in=perms).first()
    resp = site.post(
        f"/admin/auth/group/{viewer.pk}/change/",
        {"name": "viewer", "permissions": [*perms, operate.pk]},
    )
    assert resp.status_code == 302, resp.content[:2000]
    [entry] = entries("role.change")
    assert entry.before == {"permissions": ["view_console"]}
    assert entry.after == {"permissions": sorted(["view_console", operate.codename])}


def test_a_token_revoked_in_the_admin_is_audited(site, root):
    token, _ = create_token(actor=Actor(user=root, name="root"), name="ci")
    resp = site.post(
        f"/admin/accounts/apitoken/{token.pk}/change/",
        {
            "user": root.pk,
            "name": "ci",
            "scope": "read",
            "allowed_models": "[]",
            "expires_at_0": "",
            "expires_at_1": "",
            "revoked_at_0": "2026-01-01",
            "revoked_at_1": "00:00:00",
        },
    )
    assert resp.status_code == 302, resp.content[:3000]
    [entry] = entries("token.change")
    assert entry.before == {"revoked_at": None} and entry.after["revoked_at"].startswith("2026")
    assert ApiToken.objects.get().revoked_at is not None
