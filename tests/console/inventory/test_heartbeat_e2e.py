"""A real host agent (simulated NPUs) beats through a real Redis into a real console worker."""

from __future__ import annotations

import pytest

from console.accounts.services import Actor
from console.inventory.checks import request_checks
from console.inventory.enrollment import create_enrollment_token
from console.inventory.heartbeats import mark_offline
from console.inventory.models import Node, NodeCheckRun
from tests.kit import start_agent, wait_for

pytestmark = pytest.mark.worker


def test_agent_registers_reports_checks_goes_offline_and_comes_back(
    console_worker, redis_url, admin_user, tmp_path, settings
):
    _, raw = create_enrollment_token(actor=Actor(user=admin_user, name="ada"), name="e2e")
    agent = start_agent(redis_url, raw, tmp_path, name="sim-e2e", simulated=True)
    try:
        node = wait_for(
            lambda: Node.objects.filter(name="sim-e2e", simulated=True, status="online").first(),
            60,
            message="the node to enroll and beat",
        )
        assert node.credentials.filter(revoked_at=None).count() == 1
        wait_for(lambda: node.accelerators.count() > 0, 30, message="accelerators")
        assert set(node.accelerators.values_list("vendor", flat=True)) == {"huawei"}

        startup = wait_for(
            lambda: NodeCheckRun.objects.filter(node=node, trigger="agent-start").first(),
            30,
            message="the agent-start checks",
        )
        names = {r["name"] for r in startup.results}
        assert {"npu-smi", "driver-devices", "cann", "disk-space", "clock-skew"} <= names
        run = request_checks(actor=Actor(user=admin_user, name="ada"), name="sim-e2e")
        done = wait_for(
            lambda: NodeCheckRun.objects.exclude(status="pending").filter(pk=run.pk).first(),
            30,
            message="the on-demand checks",
        )
        assert done.status in {"passed", "failed"} and done.results
        # measured by pings through the real channel: one host, so well within its bound
        (clock,) = [r for r in done.results if r["name"] == "clock-skew"]
        assert clock["ok"] and clock["evidence"].startswith("agent clock is "), clock

        agent.stop()
        settings.HEARTBEAT_INTERVAL_S = 1
        wait_for(
            lambda: (
                "sim-e2e" in mark_offline() or Node.objects.get(name="sim-e2e").status == "offline"
            ),
            30,
            interval=0.5,
            message="offline detection",
        )
        agent = start_agent(redis_url, raw, tmp_path, name="sim-e2e", simulated=True)
        wait_for(
            lambda: Node.objects.get(name="sim-e2e").status == "online", 60, message="back online"
        )
    except AssertionError:
        print("--- console worker ---\n", console_worker.output()[-6000:])
        print("--- agent ---\n", agent.output()[-6000:])
        raise
    finally:
        agent.stop()
