"""Which deployment holds which NPU: the node page (each NPU's replica and multi-host member,
linked) and the deployment list (each deployment's nodes and NPUs), in a bounded number of
queries."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.deployments.models import NpuAllocation, ReplicaMember
from console.inventory.models import Accelerator
from tests.kit import make_deployment, make_node, make_replica

pytestmark = pytest.mark.django_db


def hold(replica, node, *npus: int) -> None:
    NpuAllocation.objects.bulk_create(
        NpuAllocation(accelerator=a, replica=replica)
        for a in Accelerator.objects.filter(node=node, npu_id__in=npus)
    )


def fleet():
    """a2-0 (8 NPUs): qwen replica 0 on NPUs 0-1; member 1 (headless) of the two-host
    deepseek replica on NPUs 4-7, whose leader holds NPUs 0-7 of a2-1."""
    a0, a1 = make_node("a2-0", npus=8), make_node("a2-1", npus=8)
    qwen = make_deployment("qwen", ports=[8100], node=a0)
    hold(qwen.replica_set.get(), a0, 0, 1)
    ds = make_deployment("deepseek", ports=[8200], node=a1, nodes_per_replica=2)
    replica = ds.replica_set.get()
    for rank, node in enumerate((a1, a0)):
        ReplicaMember.objects.create(replica=replica, rank=rank, node=node)
    hold(replica, a1, *range(8))
    hold(replica, a0, 4, 5, 6, 7)
    return qwen, ds


def rows_of(body: str, testid: str) -> list[str]:
    return body.split(f'data-testid="{testid}"')[1:]


def test_node_page_names_the_replica_and_member_holding_each_npu(viewer_client):
    qwen, ds = fleet()
    body = viewer_client.get("/nodes/a2-0/").content.decode()
    rows = rows_of(body, "npu-row")
    assert len(rows) == 8
    q = qwen.replica_set.get()
    assert f'href="/deployments/qwen/#replica-{q.pk}"' in rows[0] and "replica 0" in rows[0]
    assert "free" in rows[3]
    d = ds.replica_set.get()
    assert f'href="/deployments/deepseek/#replica-{d.pk}"' in rows[5]
    assert "member 1 (headless)" in rows[5]
    leader = viewer_client.get("/nodes/a2-1/").content.decode()
    assert "member 0 (leader)" in rows_of(leader, "npu-row")[0]


def test_node_page_queries_do_not_grow_with_npus_held(viewer_client):
    fleet()
    with CaptureQueriesContext(connection) as few:
        viewer_client.get("/nodes/a2-0/")
    NpuAllocation.objects.all().delete()
    node = Accelerator.objects.filter(node__name="a2-0").first().node
    for npu in range(8):  # eight deployments, each holding one chip of a2-0
        hold(make_replica(make_deployment(f"many-{npu}"), node=node), node, npu)
    with CaptureQueriesContext(connection) as many:
        body = viewer_client.get("/nodes/a2-0/").content.decode()
    assert len(rows_of(body, "npu-holder")) == 8
    assert len(many) <= len(few), [q["sql"] for q in many.captured_queries]


def test_deployment_list_shows_each_deployments_nodes_and_npus(
    viewer_client, django_assert_max_num_queries
):
    fleet()
    body = viewer_client.get("/deployments/").content.decode()
    placement = {c.split("</td>")[0] for c in rows_of(body, "dep-placement")}
    assert any('href="/nodes/a2-0/"' in c and ">0,1<" in c for c in placement)
    ds = next(c for c in placement if 'href="/nodes/a2-1/"' in c)
    assert ">0,1,2,3,4,5,6,7<" in ds and 'href="/nodes/a2-0/"' in ds and ">4,5,6,7<" in ds
    with CaptureQueriesContext(connection) as two:
        viewer_client.get("/deployments/")
    node = make_node("big", npus=10)
    for i in range(10):
        hold(make_replica(make_deployment(f"more-{i}"), node=node), node, i)
    with django_assert_max_num_queries(len(two)):  # twelve deployments: no query per row
        viewer_client.get("/deployments/")


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ascend"


def test_node_page_shows_the_hugepages_the_agent_parsed(viewer_client, hot):
    """A real 300I Duo capture, parsed as the agent does, through the heartbeat contract into
    the latest store: its huge pages reach the node page (the contract used to drop them)."""
    from django.utils import timezone

    from console.telemetry.services import record_heartbeat
    from workers.accelerators.ascend import parse_npu_smi_info
    from workers.contracts import Heartbeat

    text = (FIXTURES / "npu-smi-info-300i-duo-310p3-busy-hugepages-v25.5.0-partial.txt").read_text()
    chips = [c.to_dict() for c in parse_npu_smi_info(text).npus]
    node = make_node("duo")
    now = timezone.now()
    hb = Heartbeat.model_validate({"node": "duo", "sent_at": now.isoformat(), "chips": chips})
    record_heartbeat(node_id=node.pk, node_name="duo", received_at=now, hb=hb)
    body = viewer_client.get("/nodes/duo/").content.decode()
    assert "Huge pages used / total" in body
    (cell,) = rows_of(body, "hugepages")
    assert cell.startswith(">18047 / 18047<")
    make_node("no-pages", npus=1)  # no chip reports huge pages: no column
    assert "Huge pages used" not in viewer_client.get("/nodes/no-pages/").content.decode()
