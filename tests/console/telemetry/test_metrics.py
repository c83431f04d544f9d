"""/metrics: npu-exporter gauges for every fresh node from the latest store; token required."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.accounts.services import Actor, create_token
from console.inventory.models import Accelerator
from console.telemetry import services
from console.telemetry.prometheus import escape_label, format_value
from tests.console.telemetry.builders import chip, heartbeat
from tests.factories import make_deployment, make_node
from tests.helpers import make_user


def token_for(user) -> dict:
    _, raw = create_token(actor=Actor(user=user, name=user.username), name="prometheus")
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


def beat(node, chips, age_s: float = 0.0):
    at = timezone.now() - timedelta(seconds=age_s)
    hb = heartbeat(node.name, chips, sent_at=at)
    services.record_heartbeat(node_id=node.pk, node_name=node.name, received_at=at, hb=hb)


@pytest.fixture
def fleet(hot, db):
    a1 = make_node("a1", npus=2)
    Accelerator.objects.filter(node=a1, npu_id=1).update(die_id="VDIE-1")
    b2 = make_node("b2", npus=1)
    make_node("c3-silent")
    stale = make_node("d4-stale", npus=1)
    beat(a1, [chip(0), chip(1, aicore_percent=0.0, health="Warning", power_w=None)])
    beat(b2, [chip(0, name='Ascend "910B"\\x', temperature_c=55.25, hbm_used_mb=1)])
    beat(stale, [chip(0)], age_s=20)


def test_metrics_exposes_npu_exporter_gauges_for_two_nodes(fleet, viewer):
    resp = Client().get("/metrics", **token_for(viewer))
    assert resp.status_code == 200
    assert resp["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    lines = resp.content.decode().splitlines()
    pods = 'namespace="",pod_name="",container_name=""'
    a1_0 = f'id="0",model_name="910B3",vdie_id="",pcie_bus_info="0000:C1:00.0",{pods},node="a1",npu="0",chip="0"'
    a1_1 = f'id="1",model_name="910B3",vdie_id="VDIE-1",pcie_bus_info="0000:C2:00.0",{pods},node="a1",npu="1",chip="0"'
    b2_0 = (
        'id="0",model_name="Ascend \\"910B\\"\\\\x",vdie_id="",pcie_bus_info="0000:C1:00.0",'
        f'{pods},node="b2",npu="0",chip="0"'
    )
    for line in [
        "# HELP npu_chip_info_utilization the ai core utilization, unit is '%'",
        "# TYPE npu_chip_info_utilization gauge",
        f"npu_chip_info_utilization{{{a1_0}}} 37.5",
        f"npu_chip_info_utilization{{{a1_1}}} 0",
        f"npu_chip_info_hbm_used_memory{{{a1_0}}} 32768",
        f"npu_chip_info_hbm_used_memory{{{b2_0}}} 1",
        f"npu_chip_info_hbm_total_memory{{{b2_0}}} 65536",
        f"npu_chip_info_used_memory{{{a1_0}}} 2000",
        f"npu_chip_info_total_memory{{{a1_0}}} 15000",
        f"npu_chip_info_temperature{{{b2_0}}} 55.25",
        f"npu_chip_info_power{{{a1_0}}} 90.5",
        f"npu_chip_info_health_status{{{a1_0}}} 1",
        f"npu_chip_info_health_status{{{a1_1}}} 0",
        "# TYPE npu_console_node_up gauge",
        'npu_console_node_up{node="a1"} 1',
        'npu_console_node_up{node="b2"} 1',
        'npu_console_node_up{node="c3-silent"} 0',
        'npu_console_node_up{node="d4-stale"} 0',
    ]:
        assert line in lines, line
    assert not any(line.startswith(f"npu_chip_info_power{{{a1_1}") for line in lines)  # unreported
    assert not any('node="d4-stale"' in line for line in lines if line.startswith("npu_chip"))
    samples = [line for line in lines if line.startswith("npu_chip_info_utilization{")]
    assert len(samples) == 3
    # each family is contiguous: HELP, TYPE, then its samples
    families = [line.split()[2] for line in lines if line.startswith("# TYPE")]
    # 8 npu-exporter chip gauges, 2 hugepage gauges, node up, NPUs per node, NUMA node and
    # holder of each NPU, CPUs and memory per NUMA node, incidents, refused inbound messages
    assert len(families) == len(set(families)) == 18
    assert "npu_console_incidents" in families


def test_metrics_needs_a_token_of_a_user_with_a_role(hot, db, viewer):
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer npc_nope").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Basic eDp5").status_code == 401
    resp = Client().get("/metrics", **token_for(make_user("nobody", None)))
    assert resp.status_code == 403
    assert client_with_session(viewer).get("/metrics").status_code == 401  # tokens only


def client_with_session(user):
    client = Client()
    client.force_login(user)
    return client


def test_value_and_label_formatting():
    assert [format_value(v) for v in (3, 2.0, 0.5, True, float("nan"), float("-inf"))] == [
        "3",
        "2",
        "0.5",
        "1",
        "NaN",
        "-Inf",
    ]
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


# npu-exporter's card labels, in its order: Ascend/mind-cluster @ 22bb3d987bc0, files
# component/npu-exporter/collector/common/constants.go (the names) and
# collector/common/metrics_collector.go (CardLabel); docs/telemetry.md, "npu-exporter".
NPU_EXPORTER_CARD_LABELS = (
    "id",
    "model_name",
    "vdie_id",
    "pcie_bus_info",
    "namespace",
    "pod_name",
    "container_name",
)
NPU_EXPORTER_GAUGES = (
    "npu_chip_info_utilization",
    "npu_chip_info_hbm_used_memory",
    "npu_chip_info_hbm_total_memory",
    "npu_chip_info_used_memory",
    "npu_chip_info_total_memory",
    "npu_chip_info_temperature",
    "npu_chip_info_power",
    "npu_chip_info_health_status",
)


def samples_of(text: str) -> list[tuple[str, list[tuple[str, str]], str]]:
    """(metric, [(label, value)...] in written order, value) of every sample line."""
    import re

    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        if not rest:
            out.append((line.split()[0], [], line.split()[1]))
            continue
        body, _, value = rest.rpartition("} ")
        out.append((name, re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', body), value))
    return out


def test_npu_exporter_gauges_carry_its_label_set_then_the_consoles(hot, db, viewer):
    a3 = make_node("a3")
    # an A3 NPU holds two chips: npu-exporter's id is the physical id (collectCardLabelValue:
    # chip.PhyId), so the two dies of NPU 0 are ids 0 and 1, never both "0"
    beat(a3, [chip(0, 0, phy_id=0), chip(0, 1, phy_id=1), chip(1, 0, phy_id=2, health="UNKNOWN")])
    text = Client().get("/metrics", **token_for(viewer)).content.decode()
    got = [s for s in samples_of(text) if s[0] in NPU_EXPORTER_GAUGES]
    assert {s[0] for s in got} == set(NPU_EXPORTER_GAUGES)
    for metric, labels, _ in got:
        names = tuple(k for k, _ in labels)
        assert names == (*NPU_EXPORTER_CARD_LABELS, "node", "npu", "chip"), metric
    ids = {(d["npu"], d["chip"]): d["id"] for _, lb, _ in got for d in [dict(lb)]}
    assert ids == {("0", "0"): "0", ("0", "1"): "1", ("1", "0"): "2"}
    health = {dict(lb)["id"]: v for m, lb, v in got if m == "npu_chip_info_health_status"}
    assert health == {"0": "1", "1": "1", "2": "-1"}  # npu-exporter's getHealthCode


def test_hugepages_numa_and_holders_are_exported(hot, db, viewer):
    from console.deployments.models import NpuAllocation

    layout = [{"node": 0, "cpus": "0-23,96-119", "memory_mb": 128000}, {"node": 1, "cpus": ""}]
    duo = make_node("duo", npus=2, numa_nodes=layout)
    Accelerator.objects.filter(node=duo, npu_id=1).update(numa_node=1)
    dep = make_deployment("qwen", ports=[8100], node=duo)
    NpuAllocation.objects.create(
        accelerator=Accelerator.objects.get(node=duo, npu_id=1), replica=dep.replica_set.get()
    )
    beat(duo, [chip(0, hugepages_used=12, hugepages_total=969), chip(1)])
    lines = Client().get("/metrics", **token_for(viewer)).content.decode().splitlines()
    card = 'model_name="910B3",vdie_id="",pcie_bus_info="0000:C1:00.0",namespace="",pod_name=""'
    for line in [
        f'npc_npu_hugepages_used_pages{{id="0",{card},container_name="",node="duo",npu="0",chip="0"}} 12',
        f'npc_npu_hugepages_total_pages{{id="0",{card},container_name="",node="duo",npu="0",chip="0"}} 969',
        'machine_npu_nums{node="duo"} 2',
        'npc_npu_numa_node{node="duo",npu="1",chip="0"} 1',
        'npc_npu_replica_info{node="duo",npu="1",chip="0",deployment="qwen",replica="0"} 1',
        'npc_node_numa_cpus{node="duo",numa_node="0"} 48',
        'npc_node_numa_cpus{node="duo",numa_node="1"} 0',
        'npc_node_numa_memory_megabytes{node="duo",numa_node="0"} 128000',
    ]:
        assert line in lines, line
    # unknown is left out: NPU 0's NUMA node, NPU 1's huge pages, node 1's memory
    assert not any(x.startswith('npc_npu_numa_node{node="duo",npu="0"') for x in lines)
    assert not any(x.startswith("npc_npu_hugepages") and 'npu="1"' in x for x in lines)
    assert not any('numa_node="1"' in x and "memory" in x for x in lines if x[0] != "#")


def test_metrics_costs_the_same_queries_for_one_node_or_twenty(hot, db, viewer):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            Client().get("/metrics", **token_for(viewer))
        return len(ctx)

    beat(make_node("q0", npus=2), [chip(0), chip(1)])
    one = queries()
    for i in range(1, 20):
        beat(make_node(f"q{i}", npus=2), [chip(0), chip(1)])
    assert queries() == one
