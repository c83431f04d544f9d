"""Plain helpers shared by tests (import them; fixtures live in conftest.py)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float, interval: float = 0.05, message: str = "condition"):
    """Poll `predicate` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


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
