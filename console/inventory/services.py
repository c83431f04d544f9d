"""Writes to the inventory. Each is one transaction with its audit entry."""

from __future__ import annotations

import ipaddress
import re

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.errors import Conflict, Invalid, NotFound
from console.inventory.models import NODE_TRANSITIONS, Accelerator, AdminState, Node, NodeStatus

LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$|^$")
MAX_LABELS = 64

# Operator actions on a node -> the admin state they ask for.
NODE_ACTIONS = {
    "drain": AdminState.DRAINING,
    "maintenance": AdminState.MAINTENANCE,
    "activate": AdminState.ACTIVE,
}


def get_node(name: str) -> Node:
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise NotFound(f"no node named {name!r}", field="name")
    return node


def get_accelerator(accelerator_id: int) -> Accelerator:
    acc = Accelerator.objects.select_related("node").filter(pk=accelerator_id).first()
    if acc is None:
        raise NotFound(f"no accelerator with id {accelerator_id}", field="accelerator_id")
    return acc


def validate_labels(labels: dict) -> dict[str, str]:
    """Labels are Kubernetes-style: lowercase keys, short plain values."""
    if len(labels) > MAX_LABELS:
        raise Invalid(f"at most {MAX_LABELS} labels", field="labels")
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise Invalid(
                f"label key {key!r} must be 1-63 chars of a-z 0-9 . _ / - "
                "starting and ending alphanumeric",
                field=f"labels.{key}",
            )
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            raise Invalid(
                f"label value {value!r} must be 0-63 chars of A-Z a-z 0-9 . _ - "
                "starting and ending alphanumeric",
                field=f"labels.{key}",
            )
    return dict(sorted(labels.items()))


def set_node_labels(*, actor: Actor, name: str, labels: dict) -> Node:
    """Replace a node's labels."""
    check_role(actor, Role.OPERATOR)
    clean = validate_labels(labels)
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            raise NotFound(f"no node named {name!r}", field="name")
        before = node.labels
        node.labels = clean
        node.save(update_fields=["labels"])
        record(
            actor=actor,
            action="node.set_labels",
            obj=node,
            before={"labels": before},
            after={"labels": clean},
        )
    return node


def status_for(admin_state: str, reachable: bool) -> str:
    """The displayed status: offline wins, else what the operator asked for."""
    if not reachable:
        return NodeStatus.OFFLINE
    return {
        AdminState.ACTIVE: NodeStatus.ONLINE,
        AdminState.DRAINING: NodeStatus.DRAINING,
        AdminState.MAINTENANCE: NodeStatus.MAINTENANCE,
    }[AdminState(admin_state)]


def transition_node(
    *, node: Node, to: str, reason: str, actor: Actor, admin_state: str | None = None
) -> bool:
    """Move a node to status `to` with one conditional UPDATE and one audit entry.

    Returns False (and changes nothing) when the node is no longer in the status read, i.e.
    someone else got there first. Raises Conflict for a transition the table does not allow.
    """
    frm = node.status
    if to != frm and to not in NODE_TRANSITIONS[frm]:
        raise Conflict(f"node {node.name} cannot go from {frm} to {to}", field="status")
    fields = {"status": to, "status_reason": reason[:300]}
    if admin_state is not None:
        fields["admin_state"] = admin_state
    updated = Node.objects.filter(pk=node.pk, status=frm, admin_state=node.admin_state).update(
        **fields
    )
    if not updated:
        return False
    record(
        actor=actor,
        action="node.status",
        obj=node,
        message=reason,
        before={"status": frm, "admin_state": node.admin_state},
        after={"status": to, "admin_state": fields.get("admin_state", node.admin_state)},
    )
    for key, value in fields.items():
        setattr(node, key, value)
    return True


def set_node_state(*, actor: Actor, name: str, action: str, reason: str = "") -> Node:
    """Drain, put into maintenance, or re-activate a node (operator). Idempotent."""
    check_role(actor, Role.OPERATOR)
    if action not in NODE_ACTIONS:
        raise Invalid(f"action must be one of {', '.join(NODE_ACTIONS)}", field="action")
    admin_state = NODE_ACTIONS[action]
    with transaction.atomic():
        node = get_node(name)
        if node.admin_state == admin_state:
            return node
        to = status_for(admin_state, node.status != NodeStatus.OFFLINE)
        reason = reason or f"{action} requested by {actor.name}"
        if not transition_node(
            node=node, to=to, reason=reason, actor=actor, admin_state=admin_state
        ):
            raise Conflict(
                f"node {name} changed while you were acting on it; retry", field="status"
            )
    return node


def set_isolation(
    *, actor: Actor, accelerator_id: int, isolated: bool, reason: str = ""
) -> Accelerator:
    """Isolate an NPU chip from scheduling (reason required) or release it. Idempotent."""
    check_role(actor, Role.OPERATOR)
    reason = reason.strip()
    if isolated and not reason:
        raise Invalid("isolating an NPU needs a reason", field="reason")
    with transaction.atomic():
        acc = (
            Accelerator.objects.select_for_update()
            .select_related("node")
            .filter(pk=accelerator_id)
            .first()
        )
        if acc is None:
            raise NotFound(f"no accelerator with id {accelerator_id}", field="id")
        if acc.isolated == isolated:
            return acc
        before = {"isolated": acc.isolated, "reason": acc.isolation_reason}
        acc.isolated = isolated
        acc.isolation_reason = reason[:300] if isolated else ""
        acc.isolated_at = timezone.now() if isolated else None
        acc.save(update_fields=["isolated", "isolation_reason", "isolated_at"])
        record(
            actor=actor,
            action="accelerator.isolate" if isolated else "accelerator.release",
            obj=acc,
            message=reason,
            before=before,
            after={"isolated": acc.isolated, "reason": acc.isolation_reason},
        )
    return acc


# --- addresses ----------------------------------------------------------------------------
def address_allowed(address: str) -> bool:
    """True when `address` ("" or a canonical IP address, see workers.contracts.HostInfo) may
    be a node's: empty, or inside one of NODE_ADDRESS_CIDRS (when the admin set any)."""
    networks = settings.NODE_ADDRESS_CIDRS
    if not address or not networks:
        return True
    ip = ipaddress.ip_address(address)
    return any(ip.version == net.version and ip in net for net in networks)


def report_node_address(*, node_id: int, name: str, address: str) -> None:
    """Apply the address a node's agent reports (heartbeats call this only when the node's
    reported facts changed, never per beat). Idempotent.

    The first address is taken as is; "" (the agent found none) keeps what is known. A
    different address on a node that has one is a change an admin accepts
    (accept_node_address): it becomes `pending_address`, recorded once per distinct pending
    address as `node.address_pending` on the node's journal. NODE_ADDRESS_AUTO_ACCEPT applies
    it at once instead (recorded as `node.address`). Every write is one conditional UPDATE:
    concurrent beats record the change once."""
    if not address:
        return
    nodes = Node.objects.filter(pk=node_id)
    row = nodes.values_list("address", "pending_address").first()
    if row is None:  # deleted meanwhile
        return
    current, pending = row
    if address == current:  # back to the known address: nothing left to accept
        if pending:
            nodes.filter(pending_address=pending).update(pending_address="")
        return
    if not current:
        nodes.filter(address="").update(address=address, pending_address="")
        return
    node, actor = Node(pk=node_id, name=name), Actor(user=None, name=f"agent {name}", via="agent")
    with transaction.atomic():
        if settings.NODE_ADDRESS_AUTO_ACCEPT:
            if nodes.filter(address=current).update(address=address, pending_address=""):
                record(
                    actor=actor,
                    action="node.address",
                    obj=node,
                    message=f"address changed: {current} → {address} (NODE_ADDRESS_AUTO_ACCEPT)",
                    before={"address": current},
                    after={"address": address},
                )
        elif pending != address and nodes.filter(pending_address=pending).update(
            pending_address=address
        ):
            record(
                actor=actor,
                action="node.address_pending",
                obj=node,
                message=f"address change pending: {current} → {address} (an admin accepts it)",
                before={"address": current},
                after={"pending_address": address},
            )


def accept_node_address(*, actor: Actor, name: str) -> Node:
    """Make the node's pending address its address (admin). Conflict when none is pending;
    Invalid when it is outside NODE_ADDRESS_CIDRS as they are now."""
    check_role(actor, Role.ADMIN)
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            raise NotFound(f"no node named {name!r}", field="name")
        if not node.pending_address:
            raise Conflict(f"node {name} has no address change pending", field="pending_address")
        if not address_allowed(node.pending_address):
            raise Invalid(
                f"{node.pending_address} is outside NODE_ADDRESS_CIDRS", field="pending_address"
            )
        before = node.address
        node.address, node.pending_address = node.pending_address, ""
        node.save(update_fields=["address", "pending_address"])
        record(
            actor=actor,
            action="node.address_accept",
            obj=node,
            message=f"address change accepted: {before or '—'} → {node.address}",
            before={"address": before},
            after={"address": node.address},
        )
    return node
