"""The console's auth backend answers exactly what Django's ModelBackend answers, in one query."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.accounts.backends import ConsoleBackend
from console.accounts.services import has_role, user_role

User = get_user_model()


def perm(codename: str) -> Permission:
    return Permission.objects.get(content_type__app_label="accounts", codename=codename)


def fresh(user):
    return User.objects.get(pk=user.pk)  # no per-request permission cache


@pytest.fixture
def people(db):
    viewer = User.objects.create_user("v", password="x")
    viewer.groups.add(Group.objects.get(name="viewer"))
    both = User.objects.create_user("b", password="x")
    both.groups.add(Group.objects.get(name="operator"), Group.objects.get(name="viewer"))
    both.user_permissions.add(perm("administer_console"), Permission.objects.first())
    direct = User.objects.create_user("d", password="x")
    direct.user_permissions.add(perm("operate_console"))
    nobody = User.objects.create_user("n", password="x")
    gone = User.objects.create_user("g", password="x", is_active=False)
    gone.groups.add(Group.objects.get(name="admin"))
    root = User.objects.create_superuser("r", password="x")
    return [viewer, both, direct, nobody, gone, root]


def test_the_same_permissions_as_model_backend_for_every_kind_of_user(people):
    for user in people:
        expected = ModelBackend().get_all_permissions(fresh(user))
        assert ConsoleBackend().get_all_permissions(fresh(user)) == expected, user.username
    assert ConsoleBackend().get_all_permissions(fresh(people[1])) >= {
        "accounts.administer_console",
        "accounts.operate_console",
        "accounts.view_console",
    }
    assert ConsoleBackend().get_all_permissions(fresh(people[4])) == set()  # inactive


def test_roles_through_the_backend(people):
    viewer, both, direct, nobody, gone, root = (fresh(u) for u in people)
    assert [user_role(u) for u in (viewer, both, direct, nobody, gone, root)] == [
        "viewer", "admin", "operator", None, None, "admin",
    ]  # fmt: skip
    assert not ConsoleBackend().has_perm(viewer, "accounts.view_console", obj=object())


def test_a_role_check_is_one_query_and_cached_for_the_request(people):
    user = fresh(people[1])
    with CaptureQueriesContext(connection) as queries:
        assert has_role(user, "viewer") and has_role(user, "admin")
    assert len(queries) == 1
