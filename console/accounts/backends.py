"""The console's authentication backend: Django's ModelBackend, with a user's permissions read
in one query.

Every page checks a role (`has_role` -> `user.has_perm`). ModelBackend reads a user's own
permissions and their groups' permissions in two ORM queries; on PostgreSQL those cost ~1.6 ms
a page, most of it the ORM compiling two joins, against a trivial view's ~10 ms
(docs/scale.md §2). Here one prepared statement returns the same set (~0.6 ms). Everything
else — password sign-in, `is_active`, superusers (every permission), object permissions
(none), the per-request `_perm_cache` — is ModelBackend's own.

Hand-written SQL rather than the ORM on purpose: it is the one query every request makes, and
the table and column names come from the models, so a swapped-in table name still holds.
"""

from __future__ import annotations

import functools

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connections, router


@functools.cache
def _permissions_sql(vendor: str) -> str:
    """SELECT app_label, codename of the permissions a user holds directly or through a group
    (parameters: the user's id, twice). Cached per database vendor (quoting)."""
    ops = connections[router.db_for_read(Permission)].ops
    q = ops.quote_name
    user = get_user_model()
    direct = user.user_permissions.through._meta
    member = user.groups.through._meta
    grants = Group.permissions.through._meta
    user_fk = user._meta.model_name
    perm, ctype = Permission._meta, ContentType._meta
    # identifiers from the models' metadata, quoted; the user's id goes in as a parameter
    return (
        f"SELECT ct.{q('app_label')}, p.{q('codename')} "  # noqa: S608
        f"FROM {q(perm.db_table)} p JOIN {q(ctype.db_table)} ct "
        f"ON ct.{q(ctype.pk.column)} = p.{q(perm.get_field('content_type').column)} "
        f"WHERE p.{q(perm.pk.column)} IN ("
        f"SELECT d.{q(direct.get_field('permission').column)} FROM {q(direct.db_table)} d "
        f"WHERE d.{q(direct.get_field(user_fk).column)} = %s "
        f"UNION SELECT g.{q(grants.get_field('permission').column)} FROM {q(grants.db_table)} g "
        f"JOIN {q(member.db_table)} m "
        f"ON m.{q(member.get_field('group').column)} = g.{q(grants.get_field('group').column)} "
        f"WHERE m.{q(member.get_field(user_fk).column)} = %s)"
    )


class ConsoleBackend(ModelBackend):
    """ModelBackend; `get_all_permissions` of an active, non-superuser in one query."""

    def get_all_permissions(self, user_obj, obj=None) -> set[str]:
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if user_obj.is_superuser:  # every permission: ModelBackend's way
            return super().get_all_permissions(user_obj, obj)
        if not hasattr(user_obj, "_perm_cache"):
            connection = connections[router.db_for_read(Permission)]
            with connection.cursor() as cursor:
                cursor.execute(_permissions_sql(connection.vendor), [user_obj.pk, user_obj.pk])
                user_obj._perm_cache = {f"{app}.{codename}" for app, codename in cursor}
        return user_obj._perm_cache
