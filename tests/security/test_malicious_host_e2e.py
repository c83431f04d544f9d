"""Promise (issue 12), end to end: a host with Redis access and another rack's enrollment token
finds nothing to change about an agent enrolled the normal way.

Real processes: a console worker (which runs the inbox consumer) and a real agent (node A,
simulated NPUs) enrolled with rack A's token. The attacker is a plain redis-py client on the
same Redis that enrolls itself as node B with rack B's token, watches the traffic (MONITOR: a
Redis without per-node ACLs lets it) and then: forges A's beats, engine reports and log lines
into `npc:inbox`; replays a message of A it saw; pushes unsigned, B-signed and replayed
commands onto A's command list; asks to enroll as A. Through it all the database shows nothing
changed for A, and A keeps beating.
"""

from __future__ import annotations

import secrets
import threading
import time

import pytest
import redis

from console.accounts.services import Actor
from console.deployments.models import Replica
from console.diagnosis.models import Incident
from console.inventory.commands import send_command
from console.inventory.enrollment import create_enrollment_token
from console.inventory.heartbeats import SEEN_KEY
from console.inventory.identity import node_key
from console.inventory.models import Node, NodeCredential
from console.logs.models import LogLine
from tests.kit import make_deployment, make_replica, start_agent, wait_for
from tests.node_support import sealed
from tests.security.hostile_hosts import (
    YEAR_2099,
    beat,
    engine_report,
    log_batch,
    random_identity,
    refusal_counts,
    refused_since,
)
from workers import channel
from workers.contracts import Tasks

pytestmark = [pytest.mark.security, pytest.mark.worker]
HB, REPORT, LOGS = Tasks.HEARTBEAT, Tasks.ENGINE_REPORT, Tasks.LOG_LINES


class Watcher:
    """The attacker's MONITOR: every RPUSH it sees, as (key, payload)."""

    def __init__(self, url: str) -> None:
        self.pushed: list[tuple[str, bytes]] = []
        self._client = redis.Redis.from_url(url)
        self._monitor = self._client.monitor().__enter__()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                command = self._monitor.next_command()["command"]
            except Exception:  # noqa: BLE001 - closed at the end
                return
            if command.startswith("RPUSH "):
                _, key, payload = command.split(" ", 2)
                self.pushed.append((key, payload.encode()))

    def seen(self, key: str, node: str | None = None) -> list[bytes]:
        return [
            p
            for k, p in list(self.pushed)
            if k == key and (node is None or f'"n":"{node}"'.encode() in p)
        ]

    def close(self) -> None:
        self._stop.set()
        self._client.close()
        self._monitor.connection.disconnect()


def last_seen(r, node: str) -> float:
    return r.zscore(SEEN_KEY, node) or 0.0


def victim_state(name: str, replica_id: int) -> dict:
    """What must not change for A (its last beat time moves on, by design)."""
    node = Node.objects.filter(name=name)
    return {
        "node": node.values("address", "pending_address", "status", "admin_state").get(),
        "creds": sorted(
            NodeCredential.objects.filter(node__name=name).values_list("pk", "revoked_at")
        ),
        "replica": Replica.objects.filter(pk=replica_id)
        .values("node_id", "state", "state_reason", "generation", "pid", "exit_code")
        .get(),
        "incidents": Incident.objects.count(),
        "log_lines": LogLine.objects.count(),
    }


def test_a_host_with_redis_and_another_racks_token_finds_nothing_to_change(
    console_worker, redis_url, admin_user, tmp_path
):
    admin = Actor(user=admin_user, name="ada")
    suffix = secrets.token_hex(2)
    a_name, b_name = f"rack-a-{suffix}", f"rack-b-{suffix}"
    _, rack_a = create_enrollment_token(actor=admin, name="rack a", node_pattern="rack-a-*")
    # rack B's token is broad enough to name A: only A's enrollment stands in the way
    _, rack_b = create_enrollment_token(actor=admin, name="rack b", node_pattern="rack-*")
    attacker = redis.Redis.from_url(redis_url)
    watcher = Watcher(redis_url)
    agent = start_agent(
        redis_url, rack_a, tmp_path, name=a_name, simulated=True, state_dir=tmp_path / "agent"
    )
    try:
        node = wait_for(
            lambda: Node.objects.filter(name=a_name, status="online").first(),
            60,
            message="the agent to enroll and beat",
        )
        wait_for(lambda: node.check_runs.exists(), 30, message="the agent-start checks")
        dep = make_deployment(
            f"dep-{suffix}", model_path="/models/m", served_model_name="m", device="npu"
        )
        replica = make_replica(dep, node=node, generation=3, pid=77)
        # The attacker enrolls itself the normal way with its own rack's token.
        b = channel.request_enrollment(
            attacker, node=b_name, raw_token=rack_b, agent_version="0.2.0", timeout=20
        )
        # A command the console sends A, which the attacker watches go by.
        ping_id = send_command(a_name, Tasks.HOST_PING, ["hello"], reply=True)
        wait_for(
            lambda: attacker.exists(channel.reply_key(a_name, ping_id)), 20, message="A's answer"
        )
        observed_cmd = wait_for(
            lambda: watcher.seen(channel.cmd_key(a_name)), 10, message="the command seen"
        )[0]
        observed_msg = wait_for(
            lambda: watcher.seen(channel.INBOX_KEY, a_name), 10, message="A's message seen"
        )[0]
        a_identity = channel.Identity.load(tmp_path / "agent" / "identity.json")
        a_key = node_key(a_name, a_identity.kid)  # the test's view only: to check the capture
        assert channel.verify(a_key, *channel.unseal_unverified(observed_cmd)[:2])
        assert channel.verify(a_key, *channel.unseal_unverified(observed_msg)[:2])

        before, counted = victim_state(a_name, replica.pk), refusal_counts()
        refusals_logged = agent.output().count("command refused")

        # 1. into the inbox: impersonation, no credential, replay, B writing A's replica, junk
        forged = [
            sealed(b, HB, beat(a_name, address="10.66.6.6"), node=a_name),
            sealed(a_identity, HB, beat(a_name), key=b.key),
            sealed(random_identity(a_name, a_identity.kid), HB, beat(a_name)),
            sealed(b, HB, beat(a_name)),
            sealed(b, REPORT, engine_report(b_name, replica, at=YEAR_2099.isoformat())),
            sealed(b, REPORT, engine_report(b_name, replica, phase="stopped")),
            sealed(b, LOGS, log_batch(b_name, replica)),
            sealed(b, HB, beat(b_name), t=time.time() + 3600),
            sealed(b, HB, beat(b_name), t=time.time() - 7200),
            observed_msg,
            observed_msg,
            b"not a message",
            b"x" * (channel.MAX_MESSAGE_BYTES + 1),
        ]
        attacker.rpush(channel.INBOX_KEY, *forged)
        # 2. onto A's command list: unsigned, signed with B's key, B's own, a replay
        _, b_signed = channel.command(
            b.key, node=a_name, kid=a_identity.kid, task=Tasks.HOST_STOP_REPLICA, args=[replica.pk]
        )
        _, b_own = channel.command(
            b.key, node=b_name, kid=b.kid, task=Tasks.HOST_START_REPLICA, args=[{}]
        )
        unsigned = b"0" * 64 + b"." + observed_cmd.partition(b".")[2]
        attacker.rpush(channel.cmd_key(a_name), unsigned, b_signed, b_own, observed_cmd)
        # 3. enroll as A with rack B's token, and with a made-up token
        with pytest.raises(channel.Refused, match="already enrolled"):
            channel.request_enrollment(
                attacker, node=a_name, raw_token=rack_b, agent_version="0.2.0", timeout=20
            )
        with pytest.raises(TimeoutError):
            channel.request_enrollment(
                attacker, node=a_name, raw_token=rack_b + "x", agent_version="0.2.0", timeout=2
            )

        # (B's report dated 2099 may be refused as "future" before "not-yours")
        expected = {"identity": 1, "signature": 2, "impersonation": 1, "not-yours": 2}
        expected |= {"future": 1, "stale": 1, "replay": 2, "malformed": 1, "too-large": 1}
        wait_for(
            lambda: all(refused_since(counted).get(k, 0) >= n for k, n in expected.items()),
            20,
            message=f"the refusals {expected}",
        )
        wait_for(
            lambda: agent.output().count("command refused") >= refusals_logged + 4,
            20,
            message="the agent to refuse the four forged commands",
        )
        out = agent.output()
        assert "already run (replay)" in out and "bad signature" in out
        assert f"command {Tasks.HOST_STOP_REPLICA}" not in out  # never ran
        assert attacker.llen(channel.reply_key(a_name, ping_id)) == 1  # answered once

        # A keeps beating throughout, and nothing of A changed.
        seen = last_seen(attacker, a_name)
        wait_for(lambda: last_seen(attacker, a_name) > seen + 1, 20, message="A's next beats")
        assert victim_state(a_name, replica.pk) == before
        assert Node.objects.get(name=a_name).status == "online"
        assert not (tmp_path / "agent" / "engines" / str(replica.pk)).exists()  # nothing started
    except AssertionError:
        print("--- console worker ---\n", console_worker.output()[-6000:])
        print("--- agent ---\n", agent.output()[-6000:])
        raise
    finally:
        watcher.close()
        agent.stop()
        attacker.close()
