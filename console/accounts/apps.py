from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _ensure_roles(sender, **kwargs) -> None:
    from console.accounts.services import ensure_roles

    ensure_roles()


class AccountsConfig(AppConfig):
    name = "console.accounts"
    label = "accounts"
    verbose_name = "Accounts, tokens and audit"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from console.accounts.middleware import note_password_state

        post_migrate.connect(_ensure_roles, sender=self)
        user_logged_in.connect(note_password_state, dispatch_uid="npc-password-state")
