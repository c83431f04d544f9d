"""Users and signed-in clients for tests (fixtures live in conftest.py; the rest of what tests
share is the kit, tests/kit/)."""

from __future__ import annotations

from tests.kit.waiting import wait_for

__all__ = ["client_for", "make_user", "wait_for"]  # wait_for: the kit's, for older imports


def make_user(username: str, role: str | None):
    from django.contrib.auth import get_user_model

    from console.accounts.services import Actor, ensure_roles, set_role

    ensure_roles()
    user = get_user_model().objects.create_user(
        username=username, password="pw-" + username + "-123"
    )
    if role:
        set_role(actor=Actor.system("test"), user=user, role=role)
    return user


def client_for(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client
