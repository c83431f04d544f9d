"""The signed channel between host agents and the console, on plain Redis lists.

Shared by both halves (standard library + redis-py only; no Django, no Celery). Why not Celery
for this hop: least privilege needs per-node keys, and kombu's Redis transport shares keys
between all its consumers (the `unacked` hash, `_kombu.binding.*`, result keys, pidbox
channels); and a message per task costs ~2 ms of transport where a batch of 500 costs ~20 µs
each (docs/architecture.md, "Host <-> console channel").

Every message is `<hex HMAC-SHA256>.<JSON>`, the MAC taken over the JSON bytes exactly as
sent, keyed with the node's own key (issued at enrollment, never sent again):

- inbound (agent -> console), RPUSH `npc:inbox`:
  {"v": 1, "n": node, "kid": credential id, "k": kind, "t": unix time, "s": seq, "b": body}
  `s` grows strictly per node (the agent pushes under one lock, so list order is seq order);
  the console refuses a seq it has seen (replay) and a `t` outside its skew window.
- commands (console -> agent), RPUSH `npc:cmd:<node>`:
  {"v": 1, "n": node, "kid": kid, "k": task, "id": hex, "t": time, "x": args, "r": reply?}
  `x` is the JSON argument list encrypted for the node (keystream_xor), then MAC'd.
- replies (agent -> console), RPUSH + EXPIRE `npc:reply:<node>:<id>`:
  {"v": 1, "n": node, "kid": kid, "id": id, "t": time, "b": result}
- enrollment (bootstrap), RPUSH `npc:enroll`, MAC keyed with SHA-256(enrollment token), so the
  token itself never travels; the key comes back wrapped under an ephemeral Diffie-Hellman
  secret (RFC 3526 group 14), so even a reader of the whole Redis does not learn it:
  {"v": 1, "n": node, "hint": token[:10], "rid": reply id, "dh": hex, "t": time, ...}
  and the reply on `npc:enroll:reply:<rid>`, MAC keyed the same way.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

log = logging.getLogger(__name__)

PROTOCOL = 1
INBOX_KEY = "npc:inbox"
ENROLL_KEY = "npc:enroll"
BOOTSTRAP_USER = "npc-bootstrap"
# A log batch holds <= 512 KiB of text (workers/engine/shipper.py); JSON escapes control
# characters up to 6x. Larger is refused before it is parsed.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_FUTURE_S = 120.0  # a message dated further ahead of the receiver's clock is refused
MAX_AGE_S = 900.0  # older than this when read: refused (the list keeps messages while the
#                    console is down; a longer outage loses beats, never applies stale ones)
REPLY_TTL_S = 60
COMMAND_MAX_AGE_S = 3600.0  # an agent runs no command signed longer ago

# RFC 3526, group 14 (2048-bit MODP), generator 2. A test checks it is a safe prime.
DH_P = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF",
    16,
)
DH_G = 2


class Refused(Exception):
    """A message that is not accepted; str() is the reason, safe to log (no secrets)."""

    def __init__(self, reason: str, code: str = "invalid") -> None:
        super().__init__(reason)
        self.code = code


def cmd_key(node: str) -> str:
    return f"npc:cmd:{node}"


def reply_key(node: str, cmd_id: str) -> str:
    return f"npc:reply:{node}:{cmd_id}"


def enroll_reply_key(rid: str) -> str:
    return f"npc:enroll:reply:{rid}"


def node_user(node: str) -> str:
    """The node's own Redis ACL user (when the console manages the Redis)."""
    return f"npc-node-{node}"


def redis_password(key: bytes) -> str:
    """The node's Redis password, derived from its key (both sides compute it)."""
    return hmac.new(key, b"npc.redis-acl", hashlib.sha256).hexdigest()


def fingerprint(key: bytes) -> str:
    """What admins see of a node key: enough to tell two apart, useless to an attacker."""
    return hashlib.sha256(b"npc.fingerprint" + key).hexdigest()[:16]


def token_mac_key(raw_token: str) -> bytes:
    """The enrollment MAC key: SHA-256 of the token, what the console stores (hex)."""
    return hashlib.sha256(raw_token.encode()).hexdigest().encode()


# --- sealing --------------------------------------------------------------------------------
def seal(key: bytes, doc: dict[str, Any]) -> bytes:
    data = json.dumps(doc, separators=(",", ":"), default=str).encode()
    return hmac.new(key, data, hashlib.sha256).hexdigest().encode() + b"." + data


def unseal_unverified(raw: bytes, loads=json.loads) -> tuple[bytes, bytes, dict]:
    """Split and parse a sealed message WITHOUT checking it: (mac, data, doc). Raises Refused
    for anything that is not one (too large, no MAC, not a JSON object)."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise Refused(f"message of {len(raw)} bytes (limit {MAX_MESSAGE_BYTES})", "too-large")
    mac, sep, data = raw.partition(b".")
    if not sep or len(mac) != 64:
        raise Refused("not a sealed message", "malformed")
    try:
        doc = loads(data)
    except ValueError:
        raise Refused("not JSON", "malformed") from None
    if not isinstance(doc, dict) or doc.get("v") != PROTOCOL:
        raise Refused("not a protocol-1 message", "malformed")
    return mac, data, doc


def verify(key: bytes, mac: bytes, data: bytes) -> bool:
    return hmac.compare_digest(mac, hmac.new(key, data, hashlib.sha256).hexdigest().encode())


def check_time(t: Any, now: float, *, max_age: float = MAX_AGE_S) -> float:
    """The message time as a float, or Refused when outside [now - max_age, now + future]."""
    if not isinstance(t, int | float) or isinstance(t, bool) or t != t:
        raise Refused("no timestamp", "malformed")
    if t > now + MAX_FUTURE_S:
        raise Refused(f"dated {t - now:.0f}s in the future", "future")
    if t < now - max_age:
        raise Refused(f"dated {now - t:.0f}s in the past", "stale")
    return float(t)


def keystream_xor(key: bytes, nonce: str, data: bytes) -> bytes:
    """Encrypt or decrypt `data` with HMAC-SHA256 in counter mode (a PRF keystream; the nonce
    is a command id, never reused). Command arguments travel encrypted for their node, so a
    host that can read other queues (a Redis without per-node ACLs) learns no engine key."""
    out = bytearray()
    for block in range((len(data) + 31) // 32):
        out += hmac.new(key, f"npc.cmd:{nonce}:{block}".encode(), hashlib.sha256).digest()
    return bytes(a ^ b for a, b in zip(data, out, strict=False))


def encrypt_args(key: bytes, cmd_id: str, args: list) -> str:
    data = json.dumps(args, separators=(",", ":"), default=str).encode()
    return keystream_xor(key, cmd_id, data).hex()


def decrypt_args(key: bytes, cmd_id: str, hex_data: str) -> Any:
    return json.loads(keystream_xor(key, cmd_id, bytes.fromhex(hex_data)))


def command(
    key: bytes, *, node: str, kid: int, task: str, args: list, reply: bool = False
) -> tuple[str, bytes]:
    """A console command for `node`, signed and its arguments encrypted: (id, message)."""
    cmd_id = secrets.token_hex(16)
    doc = {
        "v": PROTOCOL,
        "n": node,
        "kid": kid,
        "k": task,
        "id": cmd_id,
        "t": time.time(),
        "x": encrypt_args(key, cmd_id, args),
        "r": reply,
    }
    return cmd_id, seal(key, doc)


# --- enrollment key exchange ------------------------------------------------------------------
def dh_keypair() -> tuple[int, int]:
    private = secrets.randbits(256) | (1 << 255)
    return private, pow(DH_G, private, DH_P)


def dh_public_ok(value: int) -> bool:
    return 1 < value < DH_P - 1


def wrap_key(key: bytes, shared: int, rid: str) -> bytes:
    """XOR the 32-byte key with a pad derived from the DH secret (same call unwraps)."""
    pad = hmac.new(
        shared.to_bytes(256, "big"), b"npc.enroll.wrap" + rid.encode(), hashlib.sha256
    ).digest()
    return bytes(a ^ b for a, b in zip(key, pad, strict=True))


# --- the agent's identity -----------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """What enrollment gave this node: kept in the agent's state dir, mode 0600."""

    node: str
    kid: int
    key_hex: str
    redis_user: str = ""  # set when the console manages Redis ACLs

    @property
    def key(self) -> bytes:
        return bytes.fromhex(self.key_hex)

    @classmethod
    def load(cls, path: Path) -> Identity | None:
        try:
            doc = json.loads(path.read_text())
            return cls(**{k: doc[k] for k in ("node", "kid", "key_hex", "redis_user")})
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a node identity ({exc})") from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(self), fh)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)


def with_credentials(url: str, username: str, password: str) -> str:
    """`url` with its user and password replaced (redis:// or rediss://; a unix socket URL
    takes them as query parameters, as redis-py reads them)."""
    parts = urlsplit(url)
    if parts.scheme in ("unix", "redis+socket"):
        query = "&".join(
            p for p in parts.query.split("&") if p and not p.startswith(("username=", "password="))
        )
        extra = f"username={quote(username, safe='')}&password={quote(password, safe='')}"
        return f"unix://{parts.path}?{f'{query}&{extra}' if query else extra}"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{quote(username, safe='')}:{quote(password, safe='')}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def redis_url(url: str) -> str:
    """The broker URL as redis-py reads it (kombu's redis+socket:// is unix://)."""
    return url.replace("redis+socket://", "unix://", 1)


class AgentChannel:
    """The agent's end: send signed messages, read and verify its own commands, reply."""

    def __init__(self, r, identity: Identity, seen_path: Path | None = None) -> None:
        """seen_path: where the ids of commands already run are kept (the state dir), so a
        command read off the queue cannot be replayed after an agent restart either."""
        self.r = r
        self.identity = identity
        self._key = identity.key
        self._lock = threading.Lock()
        self._seq = 0
        self._seen_path = seen_path
        self._seen_ids: dict[str, float] = self._load_seen()

    def _load_seen(self) -> dict[str, float]:
        if self._seen_path is None:
            return {}
        try:
            seen = json.loads(self._seen_path.read_text())
            return {str(k): float(v) for k, v in seen.items()} if isinstance(seen, dict) else {}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError):
            log.warning(
                "%s unreadable: commands seen before this start are forgotten", self._seen_path
            )
            return {}

    def _save_seen(self) -> None:
        if self._seen_path is None:
            return
        tmp = self._seen_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self._seen_ids, fh)
        os.replace(tmp, self._seen_path)

    def switch(self, r, identity: Identity) -> None:
        """Use a new identity (credential rotation) from the next message on."""
        with self._lock:
            self.r, self.identity, self._key = r, identity, identity.key

    def _next_seq(self) -> int:
        # Microseconds since the epoch, strictly increasing: a restarted agent continues above
        # every seq it sent before, with nothing stored.
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return self._seq

    def send(self, kind: str, body: Any) -> None:
        """Seal and append one message to the console's inbox. Raises on Redis errors."""
        with self._lock:  # seq order = list order, whatever thread sends
            doc = {
                "v": PROTOCOL,
                "n": self.identity.node,
                "kid": self.identity.kid,
                "k": kind,
                "t": time.time(),
                "s": self._next_seq(),
                "b": body,
            }
            raw = seal(self._key, doc)
            if len(raw) > MAX_MESSAGE_BYTES:
                raise Refused(f"{kind}: {len(raw)} bytes is over the channel's limit", "too-large")
            self.r.rpush(INBOX_KEY, raw)

    def next_command(self, timeout: float = 1.0) -> dict | None:
        """The next command the console signed for this node, or None (timeout or refused;
        a refusal is logged with its reason)."""
        got = self.r.blpop([cmd_key(self.identity.node)], timeout=timeout)
        if got is None:
            return None
        try:
            return self.verify_command(got[1])
        except Refused as exc:
            log.warning("command refused: %s", exc)
            return None

    def verify_command(self, raw: bytes, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        mac, data, doc = unseal_unverified(raw)
        if not verify(self._key, mac, data):
            raise Refused("bad signature (not signed by the console for this node)", "signature")
        if doc.get("n") != self.identity.node:
            raise Refused(f"addressed to node {doc.get('n')!r}, not this one", "wrong-node")
        check_time(doc.get("t"), now, max_age=COMMAND_MAX_AGE_S)
        cmd_id = doc.get("id")
        if not isinstance(cmd_id, str) or not isinstance(doc.get("k"), str):
            raise Refused("command without id or name", "malformed")
        if cmd_id in self._seen_ids:
            raise Refused(f"command {cmd_id} already run (replay)", "replay")
        self._seen_ids = {
            i: t for i, t in self._seen_ids.items() if t > now - COMMAND_MAX_AGE_S - 100
        }
        self._seen_ids[cmd_id] = now
        self._save_seen()
        try:
            args = decrypt_args(self._key, cmd_id, str(doc.get("x", "")))
        except ValueError:
            raise Refused("command arguments do not decrypt", "malformed") from None
        if not isinstance(args, list):
            raise Refused("command arguments are not a list", "malformed")
        doc["a"] = args
        return doc

    def reply(self, command: dict, result: Any) -> None:
        doc = {
            "v": PROTOCOL,
            "n": self.identity.node,
            "kid": self.identity.kid,
            "id": command["id"],
            "t": time.time(),
            "b": result,
        }
        key = reply_key(self.identity.node, command["id"])
        pipe = self.r.pipeline(transaction=False)
        pipe.rpush(key, seal(self._key, doc))
        pipe.expire(key, REPLY_TTL_S)
        pipe.execute()


class Enrollment:
    """One agent's exchange of its enrollment token for a node identity, kept for the whole
    process: a retry re-sends the same request (same reply key, same key-exchange value), so
    an answer that arrives after a timeout is still read, never lost to a second request the
    console would refuse as a duplicate."""

    RESEND_S = 60.0
    POLL_S = 4.0  # below redis-py's default socket timeout (5 s)

    def __init__(self, *, node: str, raw_token: str, agent_version: str) -> None:
        self.node, self.agent_version = node, agent_version
        self.hint = raw_token[:10]
        self.mac_key = token_mac_key(raw_token)
        self.private, self.public = dh_keypair()
        self.rid = secrets.token_hex(32)
        self.sent_at = -1e9

    def _send(self, r) -> None:
        doc = {
            "v": PROTOCOL,
            "n": self.node,
            "hint": self.hint,
            "rid": self.rid,
            "dh": format(self.public, "x"),
            "t": time.time(),
            "agent_version": self.agent_version,
        }
        r.rpush(ENROLL_KEY, seal(self.mac_key, doc))
        self.sent_at = time.monotonic()

    def attempt(self, r, wait: float = 30.0) -> Identity:
        """Send the request (again, after RESEND_S) and wait up to `wait` seconds for the
        console's answer. Raises Refused with its reason, or TimeoutError."""
        if time.monotonic() - self.sent_at > self.RESEND_S:
            self._send(r)
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            got = r.blpop([enroll_reply_key(self.rid)], timeout=max(1, int(min(left, self.POLL_S))))
            if got is None:
                continue
            try:
                return self._identity(got[1])
            except Refused as exc:
                if exc.code != "signature":
                    raise
                log.warning("an enrollment answer not from the console was ignored: %s", exc)
        raise TimeoutError(f"no answer to the enrollment request within {wait:g}s")

    def _identity(self, raw: bytes) -> Identity:
        mac, data, answer = unseal_unverified(raw)
        if not verify(self.mac_key, mac, data) or answer.get("rid") != self.rid:
            raise Refused("the enrollment answer is not signed with this token", "signature")
        if not answer.get("ok"):
            raise Refused(str(answer.get("error") or "refused"), "enrollment")
        console_public = int(answer["dh"], 16)
        if not dh_public_ok(console_public):
            raise Refused("bad key-exchange value in the answer", "signature")
        shared = pow(console_public, self.private, DH_P)
        key = wrap_key(bytes.fromhex(answer["wrapped"]), shared, self.rid)
        return Identity(
            node=self.node,
            kid=int(answer["kid"]),
            key_hex=key.hex(),
            redis_user=answer.get("redis_user", ""),
        )


def request_enrollment(
    r, *, node: str, raw_token: str, agent_version: str, timeout: float = 30.0
) -> Identity:
    """Exchange the enrollment token for a node identity (one round trip through Redis).

    Raises Refused with the console's reason, or TimeoutError when no console answered."""
    enrollment = Enrollment(node=node, raw_token=raw_token, agent_version=agent_version)
    return enrollment.attempt(r, timeout)
