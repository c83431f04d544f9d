"""Small factories for inventory rows (plain functions, explicit defaults)."""

from __future__ import annotations

import itertools

from django.utils import timezone

from console.inventory.models import Accelerator, Node

_seq = itertools.count(1)


def make_node(name: str | None = None, *, npus: int = 0, **fields) -> Node:
    n = next(_seq)
    defaults = {
        "name": name or f"node-{n}",
        "hostname": f"host{n}.example",
        "address": f"10.0.0.{n % 250}",
        "arch": "aarch64",
        "cpu_model": "Kunpeng 920 (HiSilicon TSV110)",
        "cpu_cores": 192,
        "status": "online",
        "last_heartbeat": timezone.now(),
    }
    defaults.update(fields)
    node = Node.objects.create(**defaults)
    for i in range(npus):
        Accelerator.objects.create(
            node=node,
            npu_id=i,
            chip_id=0,
            model_name="910B3",
            hbm_total_mb=65536,
            health="OK",
            bus_id=f"0000:{0xC1 + i:02X}:00.0",
        )
    return node
