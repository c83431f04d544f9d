"""Node identity: enrollment (bootstrap token -> node credential), keys, rotation, revocation.

The model is Kubernetes' kubelet TLS bootstrap: a bootstrap (enrollment) token is used once to
obtain the node's own credential; afterwards the node signs every message with its key and the
console takes the node's identity from the key, never from the payload (NodeRestriction in
console/inventory/inbox.py). Keys are derived from the console's secret and (node, credential
id), so the database holds fingerprints only and every console process computes the same key.
"""

from __future__ import annotations

import fnmatch
import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from console.accounts.models import Role
from console.accounts.services import Actor, check_role, record
from console.errors import Conflict, NotFound
from console.hot import get_redis
from console.inventory.models import EnrollmentToken, Node, NodeCredential, NodeStatus
from workers import channel
from workers.contracts import AGENT_VERSION

log = logging.getLogger(__name__)
CRED_VERSION_KEY = "npc:cred:version"  # bumped on every issue/rotate/revoke: caches reload
ROTATION_GRACE = timedelta(minutes=10)
_NODE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_RID = re.compile(r"^[0-9a-f]{64}$")


def node_key(node: str, kid: int) -> bytes:
    """The node's 32-byte key for credential `kid` (same in every console process)."""
    secret = getattr(settings, "NODE_KEY_SECRET", "") or settings.SECRET_KEY
    return salted_hmac("npc.node-key", f"{node}:{kid}", secret=secret, algorithm="sha256").digest()


def bump_version() -> None:
    try:
        get_redis().incr(CRED_VERSION_KEY)
    except Exception:  # noqa: BLE001 - caches also reload on their own timer
        log.warning("could not signal a credential change; caches reload within their TTL")


# --- the credential cache the inbox consults per message --------------------------------------
@dataclass(frozen=True)
class Cred:
    node: str
    kid: int
    key: bytes


class CredentialCache:
    """Active credentials by (node, kid), reloaded when the version key changes (checked at
    most every `check_s`) and at least every `ttl_s`: a revocation reaches the inbox within a
    second, well inside one heartbeat interval. A miss looks at the version again after only
    `miss_check_s`: a node's first messages right after it enrolled (or rotated) are not refused
    for a second; a flood of unknown credentials costs at most one Redis GET per `miss_check_s`."""

    def __init__(
        self, check_s: float = 1.0, ttl_s: float = 30.0, miss_check_s: float = 0.05
    ) -> None:
        self.check_s, self.ttl_s, self.miss_check_s = check_s, ttl_s, miss_check_s
        self._creds: dict[tuple[str, int], Cred] = {}
        self._version: bytes | None = None
        self._loaded = self._checked = -1e9

    def get(self, node: str, kid: int) -> Cred | None:
        mono = time.monotonic()
        if mono - self._checked > self.check_s:
            self._look(mono)
        cred = self._creds.get((node, kid))
        if cred is None and mono - self._checked > self.miss_check_s:
            self._look(mono)
            cred = self._creds.get((node, kid))
        return cred

    def _look(self, mono: float) -> None:
        """Reload when the version key changed or the TTL ran out."""
        self._checked = mono
        try:
            version = get_redis().get(CRED_VERSION_KEY)
        except Exception:  # noqa: BLE001 - Redis down: the TTL still bounds staleness
            version = self._version
        if version != self._version or mono - self._loaded > self.ttl_s:
            self.reload()
            self._version = version

    def reload(self) -> None:
        now = timezone.now()
        rows = NodeCredential.objects.filter(revoked_at__isnull=True).values_list(
            "pk", "node__name", "grace_until"
        )
        self._creds = {
            (name, pk): Cred(name, pk, node_key(name, pk))
            for pk, name, grace in rows
            if grace is None or grace > now
        }
        self._loaded = time.monotonic()


# --- enrollment ---------------------------------------------------------------------------------
def handle_enrollment(raw: bytes, *, now: float | None = None) -> str:
    """Answer one enrollment request from `npc:enroll`. Returns what happened (for logs and
    counters): "issued", "answered again" (the same request again: the same credential, wrapped
    anew), "refused: …" (answered, MAC'd with the token) or "dropped: …" (no token matched, so
    no answer can be authenticated)."""
    now = time.time() if now is None else now
    try:
        mac, data, doc = channel.unseal_unverified(raw)
        node, rid, hint = doc.get("n"), doc.get("rid"), doc.get("hint")
        if not (isinstance(rid, str) and _RID.match(rid) and isinstance(hint, str)):
            raise channel.Refused("malformed enrollment request", "malformed")
        token = _token_for(hint, mac, data)
        if token is None:
            raise channel.Refused("no enrollment token matches the request", "signature")
        channel.check_time(doc.get("t"), now, max_age=300.0)
    except channel.Refused as exc:
        log.warning("enrollment request dropped: %s", exc)
        return f"dropped: {exc}"
    mac_key = token.key_hash.encode()
    try:
        if not isinstance(node, str) or not _NODE_NAME.match(node):
            raise channel.Refused("node name: a DNS label ([a-z0-9-], 1-63)", "enrollment")
        agent_public = int(str(doc.get("dh")), 16)
        if not channel.dh_public_ok(agent_public):
            raise channel.Refused("bad key-exchange value", "enrollment")
        again = _answered_before(node, token, rid)
        cred = again or _issue(node, token, rid, str(doc.get("agent_version") or "")[:32])
    except (channel.Refused, ValueError) as exc:
        log.warning("enrollment of %r with token %s refused: %s", node, token.hint, exc)
        _answer(mac_key, rid, {"ok": False, "error": str(exc)})
        return f"refused: {exc}"
    key = node_key(node, cred.pk)
    private, public = channel.dh_keypair()
    wrapped = channel.wrap_key(key, pow(agent_public, private, channel.DH_P), rid)
    redis_user = ""
    if _manage_acl(node, key):
        redis_user = channel.node_user(node)
    _answer(
        mac_key,
        rid,
        {"ok": True, "kid": cred.pk, "dh": format(public, "x"), "wrapped": wrapped.hex()}
        | {"redis_user": redis_user, "console_version": AGENT_VERSION},
    )
    return "answered again" if again else "issued"


def _token_for(hint: str, mac: bytes, data: bytes) -> EnrollmentToken | None:
    for token in EnrollmentToken.objects.filter(hint=hint[:12]):
        if channel.verify(token.key_hash.encode(), mac, data):
            return token
    return None


def _answer(mac_key: bytes, rid: str, doc: dict) -> None:
    key = channel.enroll_reply_key(rid)
    pipe = get_redis().pipeline(transaction=False)
    pipe.rpush(key, channel.seal(mac_key, {"v": channel.PROTOCOL, "rid": rid, **doc}))
    pipe.expire(key, 120)
    pipe.execute()


def enrollment_refusal(token: EnrollmentToken, node: Node | None, name: str) -> str | None:
    """Why `token` may not enroll node `name` (None when it may). Pure apart from reads."""
    if not token.is_active():
        return "the enrollment token is expired or revoked"
    if token.node_pattern and not fnmatch.fnmatchcase(name, token.node_pattern):
        return f"this token may enroll only nodes matching {token.node_pattern!r}"
    if token.max_uses is not None and token.uses >= token.max_uses:
        return "this enrollment token has been used up"
    if node is None or node.reenroll_allowed:
        return None
    creds = list(node.credentials.values_list("revoked_at", flat=True))
    if any(revoked is None for revoked in creds):
        return f"node {name} is already enrolled; an admin must allow it to enroll again"
    if creds:
        return f"node {name}'s credential was revoked; an admin must allow it to enroll again"
    if node.enrolled_with_id != token.pk:  # upgrade path: only the node's own first token
        return f"node {name} was registered with another enrollment token"
    return None


def _answered_before(name: object, token: EnrollmentToken, rid: str) -> NodeCredential | None:
    """The credential already issued for this very request (same token, same request id): the
    agent asks again because the answer was lost (a timeout, a restart of the wait). It gets
    the same credential, wrapped anew for its key-exchange value: nothing changes, and a
    replay of the request by anyone else yields an answer only that agent can unwrap."""
    return NodeCredential.objects.filter(
        node__name=name, token=token, request_id=rid, revoked_at=None
    ).first()


def _issue(name: str, token: EnrollmentToken, rid: str, agent_version: str) -> NodeCredential:
    with transaction.atomic():
        token = EnrollmentToken.objects.select_for_update().get(pk=token.pk)
        node = Node.objects.select_for_update().filter(name=name).first()
        why = enrollment_refusal(token, node, name)
        if why:
            raise channel.Refused(why, "enrollment")
        actor = Actor(user=None, name=f"agent {name}", via="agent")
        if node is None:
            node = Node.objects.create(
                name=name, hostname=name, status=NodeStatus.OFFLINE, enrolled_with=token
            )
            record(actor=actor, action="node.register", obj=node, message="enrolled")
        node.credentials.filter(revoked_at__isnull=True).update(
            revoked_at=timezone.now(),
            revoked_reason="replaced by a new enrollment",
        )
        EnrollmentToken.objects.filter(pk=token.pk).update(uses=token.uses + 1)
        Node.objects.filter(pk=node.pk).update(reenroll_allowed=False)
        cred = NodeCredential.objects.create(
            node=node, token=token, request_id=rid, issued_via=f"token {token.name}"[:150]
        )
        cred.fingerprint = channel.fingerprint(node_key(name, cred.pk))
        cred.save(update_fields=["fingerprint"])
        record(
            actor=actor,
            action="node.enroll",
            obj=node,
            message=f"credential #{cred.pk} {cred.fingerprint} issued (token {token.name}, "
            f"agent {agent_version or '?'})",
        )
        transaction.on_commit(bump_version)
    return cred


def _manage_acl(node: str, key: bytes) -> bool:
    """Create the node's Redis user when the console manages Redis ACLs (>= 7)."""
    if not getattr(settings, "REDIS_MANAGE_ACL", False):
        return False
    from console.inventory import redis_acl

    return redis_acl.ensure_node_user(get_redis(), node, channel.redis_password(key))


def wanted_acl_users() -> dict[str, list[str]]:
    """Every node's Redis passwords for its active credentials (for redis_acl.sync)."""
    now = timezone.now()
    wanted: dict[str, list[str]] = {}
    for pk, name, grace in NodeCredential.objects.filter(revoked_at__isnull=True).values_list(
        "pk", "node__name", "grace_until"
    ):
        if grace is None or grace > now:
            wanted.setdefault(name, []).append(channel.redis_password(node_key(name, pk)))
    return wanted


# --- admin: see, rotate, revoke, allow re-enrollment ----------------------------------------------
def _node_for_admin(actor: Actor, name: str) -> Node:
    check_role(actor, Role.ADMIN)
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise NotFound(f"no node named {name}", field="name")
    return node


def rotate_credential(*, actor: Actor, name: str) -> NodeCredential:
    """Issue a new credential and send it to the agent, wrapped under the current key (a
    signed command). The old one stays valid for ROTATION_GRACE, or until the agent first
    signs with the new one (console/inventory/inbox.py)."""
    from console.inventory.commands import send_command

    node = _node_for_admin(actor, name)
    with transaction.atomic():
        current = node.credentials.select_for_update().filter(revoked_at__isnull=True).first()
        if current is None:
            raise Conflict(f"node {name} has no active credential to rotate", field="name")
        new = NodeCredential.objects.create(node=node, issued_via=f"rotation by {actor.name}")
        new_key = node_key(name, new.pk)
        new.fingerprint = channel.fingerprint(new_key)
        new.save(update_fields=["fingerprint"])
        node.credentials.filter(revoked_at__isnull=True).exclude(pk=new.pk).update(
            grace_until=timezone.now() + ROTATION_GRACE
        )
        record(actor=actor, action="node.credential.rotate", obj=node, message=new.fingerprint)
        old_key = node_key(name, current.pk)
        wrapped = channel.wrap_key(new_key, int.from_bytes(old_key, "big"), f"rotate:{new.pk}")

        def after() -> None:
            bump_version()  # the inbox consumer adds the new Redis password (sync_acl)
            send_command(name, "host.rotate_credential", [new.pk, wrapped.hex()], kid=current.pk)

        transaction.on_commit(after)
    return new


def revoke_credential(*, actor: Actor, name: str, reason: str = "") -> int:
    """Revoke every credential of the node: its messages are refused from the next batch
    (within a second), and the inbox consumer removes its Redis user and cuts its open
    connections in the same second (sync_acl). Returns how many."""
    node = _node_for_admin(actor, name)
    with transaction.atomic():
        n = node.credentials.filter(revoked_at__isnull=True).update(
            revoked_at=timezone.now(), revoked_reason=(reason or "revoked by an admin")[:300]
        )
        record(actor=actor, action="node.credential.revoke", obj=node, message=reason[:200])
        transaction.on_commit(bump_version)
    return n


def sync_acl() -> None:
    """Make Redis's users match the credentials (bootstrap user included). Run by the inbox
    consumer only — at start, when credentials change and every minute (Redis forgets users
    on restart) — so it never races an enrollment, which the same thread handles."""
    if not getattr(settings, "REDIS_MANAGE_ACL", False):
        return
    from console.inventory import redis_acl

    r = get_redis()
    if settings.NPU_BOOTSTRAP_REDIS_PASSWORD:
        redis_acl.ensure_bootstrap_user(r, settings.NPU_BOOTSTRAP_REDIS_PASSWORD)
    redis_acl.sync_node_users(r, wanted_acl_users())


def allow_reenrollment(*, actor: Actor, name: str) -> Node:
    """Let the node enroll again once (a host reinstalled, its state dir lost)."""
    node = _node_for_admin(actor, name)
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(reenroll_allowed=True)
        record(actor=actor, action="node.allow_reenroll", obj=node)
    node.reenroll_allowed = True
    return node


def credentials_of(node: Node) -> list[dict]:
    """What an admin sees of a node's credentials: never a key."""
    now = timezone.now()
    return [
        {
            "id": c.pk,
            "fingerprint": c.fingerprint,
            "issued_at": c.issued_at,
            "issued_via": c.issued_via,
            "last_used_at": c.last_used_at,
            "grace_until": c.grace_until,
            "revoked_at": c.revoked_at,
            "revoked_reason": c.revoked_reason,
            "active": c.is_active(now),
        }
        for c in node.credentials.all()
    ]


def mark_used(kids: dict[int, datetime]) -> None:
    """Record when credentials were last used (called by the inbox at most once a minute per
    credential)."""
    by_time: dict[datetime, list[int]] = {}
    for kid, at in kids.items():  # a batch's messages share a time: one UPDATE each
        by_time.setdefault(at, []).append(kid)
    for at, ids in by_time.items():
        NodeCredential.objects.filter(pk__in=ids).update(last_used_at=at)
