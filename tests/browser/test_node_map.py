"""On-call's map from NPU to deployment: the node page says which replica (and multi-host
member) holds each NPU, linked to it; the deployment list says where each deployment runs."""

from __future__ import annotations

import pytest
from django.utils import timezone

from console.deployments.models import NpuAllocation, ReplicaMember
from console.inventory.models import Accelerator
from console.telemetry.services import record_heartbeat
from tests.browser.conftest import shot
from tests.browser.test_login_and_inventory import login
from tests.console.telemetry.builders import chip, heartbeat
from tests.helpers import make_user
from tests.kit import make_deployment, make_node

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def hold(replica, node, *npus: int) -> None:
    NpuAllocation.objects.bulk_create(
        NpuAllocation(accelerator=a, replica=replica)
        for a in Accelerator.objects.filter(node=node, npu_id__in=npus)
    )


def test_node_page_links_each_npu_to_its_replica_and_the_list_shows_placement(page, live_server):
    make_user("vic", "viewer")
    layout = [{"node": 0, "cpus": "0-47", "memory_mb": 257000}, {"node": 1, "cpus": "48-95"}]
    a0 = make_node("a2-0", npus=8, numa_nodes=layout)
    a1 = make_node("a2-1", npus=8)
    for npu in range(8):
        Accelerator.objects.filter(node=a0, npu_id=npu).update(numa_node=npu // 4)
    qwen = make_deployment("qwen3-32b", ports=[8100], node=a0, npus_per_replica=2)
    hold(qwen.replica_set.get(), a0, 0, 1)
    ds = make_deployment(
        "deepseek-v3", ports=[8200], node=a1, nodes_per_replica=2, npus_per_replica=16
    )
    replica = ds.replica_set.get()
    for rank, node in enumerate((a1, a0)):
        ReplicaMember.objects.create(replica=replica, rank=rank, node=node, phase="ready")
    hold(replica, a1, *range(8))
    hold(replica, a0, 4, 5, 6, 7)
    now = timezone.now()
    chips = [chip(n, hugepages_used=900 + n, hugepages_total=969) for n in range(8)]
    record_heartbeat(
        node_id=a0.pk, node_name="a2-0", received_at=now, hb=heartbeat("a2-0", chips, sent_at=now)
    )

    login(page, live_server, "vic", "pw-vic-123")
    page.goto(f"{live_server.url}/nodes/a2-0/")
    live = page.locator("[data-testid=live-npu-row]")
    assert live.count() == 8
    assert "qwen3-32b · replica 0" in live.nth(0).inner_text()
    assert "member 1 (headless)" in live.nth(5).inner_text()
    assert "free" in live.nth(2).inner_text()
    assert "900 / 969" in live.nth(0).locator("[data-testid=hugepages]").inner_text()
    inventory = page.locator("[data-testid=npu-row]")
    assert "deepseek-v3 · replica 0" in inventory.nth(7).inner_text()
    shot(page, "node-npu-map")

    live.nth(5).locator("[data-testid=npu-holder]").click()
    page.wait_for_url(f"**/deployments/deepseek-v3/#replica-{replica.pk}")

    page.goto(f"{live_server.url}/deployments/")
    cells = page.locator("[data-testid=dep-placement]")
    texts = sorted(cells.all_inner_texts())
    assert texts == ["a2-0 0,1", "a2-0 4,5,6,7\na2-1 0,1,2,3,4,5,6,7"], texts
    shot(page, "deployments-placement")
    cells.nth(0).locator("a", has_text="a2-0").click()
    page.wait_for_url("**/nodes/a2-0/")
