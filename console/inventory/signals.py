"""Keep the hot store consistent with the inventory."""

from __future__ import annotations

from django.db.models.signals import post_delete
from django.dispatch import receiver

from console.inventory.models import Node


@receiver(post_delete, sender=Node)
def forget_deleted_node(sender, instance: Node, **kwargs) -> None:
    """A deleted node's cached heartbeat state must not survive it (its id is gone)."""
    from console.inventory.heartbeats import forget_node

    forget_node(instance.name)
