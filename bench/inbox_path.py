"""The console's in-process inbound path, for the heartbeat benches: sealed beats as agents
send them, handed to the inbox as its consumer does (batches of inbox.BATCH).

Import after bench.seed.setup_django(); nodes come from bench.fleet.enroll_fleet.
"""

from __future__ import annotations

import time

from bench.seed import heartbeat_doc
from workers import channel

_seq = time.time_ns() // 1000


def beats(fleet: list, k: int, npus: int = 8) -> list[tuple[str, dict]]:
    """One heartbeat body per node, round `k` (values vary with k as real chips do)."""
    sent_at = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    out = []
    for name, _, _ in fleet:
        doc = heartbeat_doc(name, npus, k)
        doc["sent_at"] = sent_at
        out.append((name, doc))
    return out


def sealed(fleet: list, bodies: list[tuple[str, dict]]) -> list[bytes]:
    """The beats sealed by each node's own key, with fresh sequence numbers (as
    channel.AgentChannel.send writes them)."""
    global _seq
    out = []
    for (name, kid, key_hex), (_, body) in zip(fleet, bodies, strict=True):
        _seq = max(_seq + 1, time.time_ns() // 1000)
        doc = {"v": channel.PROTOCOL, "n": name, "kid": kid, "k": "console.heartbeat"}
        doc |= {"t": time.time(), "s": _seq, "b": body}
        out.append(channel.seal(bytes.fromhex(key_hex), doc))
    return out


def handle(inbox, raws: list[bytes]) -> float:
    """Seconds for Inbox.handle_batch over `raws`, in the consumer's batch size; raises if a
    beat was refused (a bench that times refusals measures nothing)."""
    from console.inventory.inbox import BATCH

    start = time.perf_counter()
    outcome = {}
    for i in range(0, len(raws), BATCH):
        for code, n in inbox.handle_batch(raws[i : i + BATCH]).items():
            outcome[code] = outcome.get(code, 0) + n
    elapsed = time.perf_counter() - start
    if outcome.get("ok") != len(raws):
        raise SystemExit(f"the inbox refused beats: {outcome}")
    return elapsed


def authenticate(inbox, raws: list[bytes]) -> float:
    """Seconds for Inbox.authenticate alone over `raws` (HMAC, credential, window, sequence,
    rate: nothing applied). Use an Inbox of its own: it advances its sequence numbers."""
    start = time.perf_counter()
    now = time.time()
    for raw in raws:
        inbox.authenticate(raw, now)
    return time.perf_counter() - start
