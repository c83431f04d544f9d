"""Rows for tests: plain functions, explicit defaults, keyword overrides (the ORM, no API).

Models are imported inside the functions: the kit stays importable where Django is not set
up (the agent-side tests run with `-p no:django`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.utils import timezone

if TYPE_CHECKING:
    from console.deployments.models import Deployment, Replica
    from console.inventory.models import Node

_seq = itertools.count(1)


def make_node(name: str | None = None, *, npus: int = 0, **fields) -> Node:
    """An online Kunpeng node that beat just now, with `npus` healthy 910B3 chips (npu_id
    0..npus-1); `fields` override any Node field."""
    from console.inventory.models import Accelerator, Node

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


def make_deployment(
    name: str | None = None,
    *,
    ports: Sequence[int] | None = None,
    node: Node | None = None,
    state: str = "ready",
    **fields,
) -> Deployment:
    """A Deployment row: the model's defaults (device npu, desired state stopped, 1 replica)
    plus model_path /models/<name> and served_model_name <name>; `fields` override any field.

    With `ports`: one replica per port (index 0, 1, ...) on `node` — a new node <name>-node
    when None — in `state`, and `replicas` defaults to len(ports). Pass the port of something
    that answers (a FakeEngine, a real engine) or refuses (closed_port()); see make_replica.
    """
    from console.deployments.models import Deployment

    name = name or f"dep-{next(_seq)}"
    values = {"name": name, "model_path": f"/models/{name}", "served_model_name": name}
    if ports is not None:
        values["replicas"] = len(ports)
    values.update(fields)
    dep = Deployment.objects.create(**values)
    if ports is not None:
        node = node or make_node(f"{name}-node")
        for port in ports:
            make_replica(dep, node=node, port=port, state=state)
    return dep


def make_replica(
    deployment: Deployment,
    *,
    node: Node | None = None,
    port: int | None = None,
    index: int | None = None,
    state: str = "ready",
    **fields,
) -> Replica:
    """A Replica row of `deployment` in `state`, at the next index (or `index`); `fields`
    override any other field.

    Placed on `node` when given (None: not placed, no port). Its port defaults to the lowest
    one of settings.ENGINE_PORT_RANGE that no replica holds on that node, as the scheduler
    picks: a number in the database, which says nothing about what listens there. A test
    whose replica must answer passes its server's port; one that must refuse, closed_port().
    """
    from django.conf import settings

    from console.deployments.models import Replica

    if index is None:
        last = deployment.replica_set.order_by("-index").values_list("index", flat=True).first()
        index = 0 if last is None else last + 1
    if node is not None and port is None:
        held = set(Replica.objects.filter(node=node).values_list("port", flat=True))
        port = next(p for p in settings.ENGINE_PORT_RANGE if p not in held)
    return Replica.objects.create(
        deployment=deployment, index=index, node=node, port=port, state=state, **fields
    )
