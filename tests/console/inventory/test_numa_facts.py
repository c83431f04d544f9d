"""Each NPU's NUMA node and the host's NUMA layout: stored from the heartbeat, shown on the node
page, returned by the API."""

from __future__ import annotations

import pytest

from console.inventory.models import Accelerator, Node
from tests.console.inventory.test_heartbeats import beat, enroll, ingest  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db

LAYOUT = {"node0": "0-47", "node1": "48-95", "node2": "96-143", "node3": "144-191"}


def numa_beat(token: str, **extra) -> dict:
    payload = beat(token, chips=2)
    payload["host"] |= {
        "numa_node_count": 4,
        "numa_cpulists": LAYOUT,
        "numa_memory_mb": {"node0": 257_000, "node1": 258_000},
    }
    payload["chips"][0] |= {"numa_node": 0, "cpu_affinity": "0-47"}
    payload["chips"][1] |= {"numa_node": 3, "cpu_affinity": "144-191"}
    return payload | extra


def test_beat_stores_the_layout_and_each_npus_node(enroll):  # noqa: F811 - the fixture
    node = Node.objects.get(pk=ingest(numa_beat(enroll)))
    assert node.numa_nodes == [
        {"node": 0, "cpus": "0-47", "memory_mb": 257_000},
        {"node": 1, "cpus": "48-95", "memory_mb": 258_000},
        {"node": 2, "cpus": "96-143", "memory_mb": None},
        {"node": 3, "cpus": "144-191", "memory_mb": None},
    ]
    assert node.numa_node_ids == {0, 1, 2, 3}
    assert list(node.accelerators.values_list("npu_id", "numa_node")) == [(0, 0), (1, 3)]


def test_an_older_agent_leaves_the_npus_without_a_node(enroll):  # noqa: F811 - the fixture
    node_id = ingest(beat(enroll))
    assert set(Accelerator.objects.filter(node_id=node_id).values_list("numa_node", flat=True)) == {
        None
    }
    assert Node.objects.get(pk=node_id).numa_nodes == []


def test_node_page_and_api_show_numa(enroll, viewer_client):  # noqa: F811 - the fixture
    ingest(numa_beat(enroll))
    page = viewer_client.get("/nodes/kp-01/").content.decode()
    assert 'data-testid="numa-node">node 0: CPUs 0-47 · 257000 MB' in page
    assert "node 3: CPUs 144-191</span>" in page
    assert '<td class="num" data-testid="npu-numa">3</td>' in page
    body = viewer_client.get("/api/v1/nodes/kp-01").json()
    assert body["numa_nodes"][1] == {"node": 1, "cpus": "48-95", "memory_mb": 258_000}
    assert [a["numa_node"] for a in body["accelerators"]] == [0, 3]
    listed = viewer_client.get("/api/v1/accelerators").json()
    rows = listed["items"] if isinstance(listed, dict) else listed
    assert sorted(a["numa_node"] for a in rows) == [0, 3]
