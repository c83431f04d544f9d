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
from tests.factories import make_node
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
    a1_0 = 'id="0",chip="0",model_name="910B3",node="a1",pcie_bus_info="0000:C1:00.0"'
    a1_1 = (
        'id="1",chip="0",model_name="910B3",node="a1",vdie_id="VDIE-1",pcie_bus_info="0000:C2:00.0"'
    )
    b2_0 = (
        'id="0",chip="0",model_name="Ascend \\"910B\\"\\\\x",node="b2",pcie_bus_info="0000:C1:00.0"'
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
    # 8 chip gauges, node up, incidents, refused inbound messages
    assert len(families) == len(set(families)) == 11
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
