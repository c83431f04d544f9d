"""A replica over two hosts on its deployment's page: the members, their roles and NPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.deployments.models import NpuAllocation, ReplicaMember
from console.inventory.models import Accelerator
from tests.browser.test_login_and_inventory import login
from tests.helpers import make_user
from tests.kit import make_deployment, make_node

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def test_the_members_of_a_multi_host_replica_are_shown(page, live_server):
    make_user("ada", "admin")
    a, b = make_node("a2-node0", npus=8), make_node("a2-node1", npus=8)
    dep = make_deployment(
        "deepseek-v3",
        node=a,
        ports=[8100],
        model_path="/models/DeepSeek-V3-W8A8",
        served_model_name="deepseek-v3",
        nodes_per_replica=2,
        npus_per_replica=16,
        tensor_parallel_size=4,
        data_parallel_size=4,
        enable_expert_parallel=True,
        quantization="ascend",
    )
    replica = dep.replica_set.get()
    replica.rpc_port, replica.generation, replica.pid = 8101, 1, 4100
    replica.save(update_fields=["rpc_port", "generation", "pid"])
    for rank, node in enumerate((a, b)):
        ReplicaMember.objects.create(
            replica=replica, rank=rank, node=node, generation=1, phase="ready", pid=4100 + rank
        )
        NpuAllocation.objects.bulk_create(
            NpuAllocation(accelerator=c, replica=replica)
            for c in Accelerator.objects.filter(node=node)
        )
    login(page, live_server, "ada", "pw-ada-123")
    page.goto(f"{live_server.url}/deployments/deepseek-v3/")
    members = page.locator("[data-testid=replica-members] tbody tr")
    assert members.count() == 2
    assert "leader" in members.nth(0).inner_text() and "headless" in members.nth(1).inner_text()
    assert "a2-node1" in members.nth(1).inner_text()
    page.screenshot(path=str(SHOTS / "deployment-multi-host.png"), full_page=True)
