"""The fleet pages cost a fixed number of queries, whatever the number of rows.

Each page, its htmx partial and the API list it mirrors is requested with 5 rows of
everything (nodes with NPUs and live telemetry, deployments with replicas and allocations,
incidents on nodes, replicas and NPUs, audit entries), then with 50, and must run the same
queries both times: an N+1 (a query per row) would add 45. The scale benches
(bench/page_latency.py) show what that buys on 1,000 nodes.
"""

from __future__ import annotations

import uuid
from itertools import count

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.accounts.models import AuditEntry
from console.deployments.models import NpuAllocation
from console.diagnosis.models import Incident
from console.hot import get_redis
from console.inventory.models import Accelerator, Node
from console.telemetry import services as telemetry
from tests.kit import make_deployment, make_replica
from workers.contracts import Heartbeat

PAGES = [
    ("/", {}),
    ("/", {"HTTP_HX_REQUEST": "true"}),
    ("/?metric=temp", {"HTTP_HX_REQUEST": "true"}),
    ("/nodes/", {}),
    ("/nodes/", {"HTTP_HX_REQUEST": "true"}),
    ("/nodes/?status=online", {"HTTP_HX_REQUEST": "true"}),
    ("/deployments/", {}),
    ("/deployments/", {"HTTP_HX_REQUEST": "true"}),
    ("/incidents/", {}),
    ("/incidents/?status=open", {}),
    ("/api/v1/nodes?limit=100", {}),
    ("/api/v1/deployments?limit=100", {}),
    ("/api/v1/incidents?limit=100", {}),
]
_seq = count()


@pytest.fixture
def hot(redis_url, monkeypatch):
    prefix = f"npc:t-{uuid.uuid4().hex[:12]}:"
    monkeypatch.setattr(telemetry, "KEY_PREFIX", prefix)
    r = get_redis()
    yield r
    keys = list(r.scan_iter(f"{prefix}*"))
    if keys:
        r.delete(*keys)


def add_fleet(rows: int) -> None:
    """`rows` more of every kind of row the fleet pages show, linked as in a real fleet."""
    now = timezone.now()
    for _ in range(rows):
        n = next(_seq)
        node = Node.objects.create(
            name=f"qc-{n:03d}",
            hostname=f"qc-{n}",
            status="online" if n % 4 else "offline",
            labels={"zone": f"az{n % 3}"},
            last_heartbeat=now,
            telemetry_ok=bool(n % 5),
        )
        accs = Accelerator.objects.bulk_create(
            Accelerator(node=node, npu_id=i, model_name="910B3", hbm_total_mb=65536, health="OK")
            for i in range(2)
        )
        dep = make_deployment(
            f"qc-dep-{n:03d}", model_path="/m", served_model_name=f"m{n}", pinned_node=node
        )
        rep = make_replica(dep, node=node)
        NpuAllocation.objects.create(accelerator=accs[0], replica=rep)
        for kind, extra in (
            ("engine.oom", {"replica": rep}),
            ("npu.health", {"accelerator": accs[1]}),
        ):
            Incident.objects.create(
                category=kind, title=kind, fingerprint=f"qc:{n}:{kind}", node=node, **extra
            )
        AuditEntry.objects.create(actor="qc", action="node.set_status", object_repr=node.name)
        hb = Heartbeat.model_validate(
            {
                "node": node.name,
                "enroll_token": "npe_querycount",
                "sent_at": now.isoformat(),
                "chips": [{"npu_id": i, "health": "OK", "aicore_percent": 5.0} for i in range(2)],
            }
        )
        telemetry.record_heartbeat(node_id=node.pk, node_name=node.name, received_at=now, hb=hb)


def queries(client, url: str, headers: dict) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        resp = client.get(url, **headers)
    assert resp.status_code == 200, (url, resp.status_code)
    return [q["sql"] for q in ctx.captured_queries]


@pytest.mark.parametrize(("url", "headers"), PAGES, ids=[f"{u} {h}" for u, h in PAGES])
def test_fleet_page_queries_do_not_grow_with_rows(viewer_client, hot, url, headers):
    add_fleet(5)
    queries(viewer_client, url, headers)  # warm: session, role and content-type caches
    few = queries(viewer_client, url, headers)
    add_fleet(45)
    many = queries(viewer_client, url, headers)
    assert len(many) == len(few), "\n".join(many)
    assert len(few) <= 12, "\n".join(few)  # and few of them: a handful per page


@pytest.mark.parametrize(
    ("url", "row"),
    [("/nodes/", 'href="/nodes/qc-'), ("/deployments/", 'href="/deployments/qc-dep-')],
)
def test_fleet_lists_show_fifty_rows_a_page_with_a_pager(viewer_client, hot, url, row):
    add_fleet(60)
    first = viewer_client.get(url).content.decode()
    second = viewer_client.get(f"{url}?page=2").content.decode()
    assert first.count(row) == 50 and second.count(row) == 10
    assert "1–50 of 60" in first and 'rel="next"' in first
    assert "51–60 of 60" in second and 'rel="prev"' in second


def test_incident_queue_and_dashboard_heatmap_page_too(viewer_client, hot):
    add_fleet(60)  # 120 incidents, 60 nodes on the heatmap
    queue = viewer_client.get("/incidents/?page=3").content.decode()
    assert queue.count('data-incident-url="') == 20 and "101–120 of 120" in queue
    dash = viewer_client.get("/?metric=temp&page=2").content.decode()
    assert dash.count('class="heatmap-label"') == 10
    assert "metric=temp&amp;page=2" in dash  # the poll keeps the page and the metric
