from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "console.inventory"
    label = "inventory"
    verbose_name = "Inventory: nodes and accelerators"

    def ready(self) -> None:
        from console.inventory import signals  # noqa: F401 - registers the receivers
