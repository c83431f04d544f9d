"""Create the first admin user when no user exists.

The password comes from NPU_CONSOLE_ADMIN_PASSWORD, else one is generated and printed once;
a generated one must be changed at the first sign-in (accounts/middleware.py).
"""

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from console.accounts.models import Role
from console.accounts.services import (
    Actor,
    ensure_roles,
    record,
    require_password_change,
    set_role,
)


class Command(BaseCommand):
    help = "Create an admin user when the console has no user yet."

    def add_arguments(self, parser):
        parser.add_argument("--username", default=os.environ.get("NPU_CONSOLE_ADMIN_USER", "admin"))

    def handle(self, *args, username: str, **options):
        user_model = get_user_model()
        if user_model.objects.exists():
            self.stdout.write("users exist; no admin created")
            return
        ensure_roles()
        given = os.environ.get("NPU_CONSOLE_ADMIN_PASSWORD")
        password = given or secrets.token_urlsafe(12)
        with transaction.atomic():
            user = user_model.objects.create_superuser(
                username=username, password=password, email=""
            )
            actor = Actor.system("ensure_admin")
            set_role(actor=actor, user=user, role=Role.ADMIN)
            record(actor=actor, action="user.create", obj=user, message="first admin user")
            if not given:  # printed on a terminal, maybe kept in a log: replaced at first use
                require_password_change(actor=actor, user=user)
        if given:
            self.stdout.write(
                f"created admin user {username!r} with the password from the environment"
            )
        else:
            self.stdout.write(
                self.style.WARNING(
                    f"created admin user {username!r} with password: {password}\n"
                    "  (shown once; the first sign-in asks for a new one)"
                )
            )
