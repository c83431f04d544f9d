"""Inventory pages render real data and their actions change the database."""

from __future__ import annotations

from console.inventory.models import Accelerator, Node
from tests.factories import make_node


def test_dashboard_shows_real_counts(viewer_client):
    make_node("n1", npus=8)
    make_node("n2", status="offline", npus=2)
    make_node("n3", status="draining", simulated=True, npus=1)
    Accelerator.objects.filter(node__name="n1", npu_id=3).update(health="Alarm")
    Accelerator.objects.filter(node__name="n1", npu_id=4).update(health="Warning")
    Accelerator.objects.filter(node__name="n1", npu_id=5).update(
        isolated=True, isolation_reason="ECC"
    )
    Accelerator.objects.filter(node__name="n2").update(health="UNKNOWN")
    resp = viewer_client.get("/")
    counts = resp.context["counts"]
    assert counts["nodes"] == {
        "total": 3,
        "online": 1,
        "offline": 1,
        "draining": 1,
        "maintenance": 0,
        "simulated": 1,
    }
    assert counts["npus"] == {
        "total": 11,
        "healthy": 7,  # n1's 6 OK chips (one isolated) and n3's
        "unhealthy": 2,
        "unknown": 2,
        "isolated": 1,
    }


def test_dashboard_htmx_request_gets_only_the_counts_partial(viewer_client):
    make_node("n1")
    resp = viewer_client.get("/", HTTP_HX_REQUEST="true")
    body = resp.content.decode()
    assert 'data-testid="nodes-total"' in body and "<html" not in body


def test_node_list_filters_and_htmx_rows(viewer_client):
    make_node("alpha")
    make_node("beta", status="offline")
    body = viewer_client.get("/nodes/?status=offline", HTTP_HX_REQUEST="true").content.decode()
    assert "beta" in body and "alpha" not in body and "<html" not in body
    assert "No node matches" in viewer_client.get("/nodes/?q=zzz").content.decode()


def test_node_detail_and_isolation_from_the_page(operator_client):
    node = make_node("n1", npus=2)
    assert "910B3" in operator_client.get("/nodes/n1/").content.decode()
    acc = node.accelerators.first()
    operator_client.post(f"/accelerators/{acc.pk}/isolation", {"isolate": "1", "reason": "HBM ECC"})
    assert Accelerator.objects.get(pk=acc.pk).isolated
    operator_client.post("/nodes/n1/labels", {"labels": "zone=z1\nrack=r7"})
    assert Node.objects.get(name="n1").labels == {"rack": "r7", "zone": "z1"}


def test_page_action_with_bad_input_shows_the_reason(operator_client):
    node = make_node("n1", npus=1)
    acc = node.accelerators.get()
    resp = operator_client.post(
        f"/accelerators/{acc.pk}/isolation", {"isolate": "1", "reason": ""}, follow=True
    )
    assert "needs a reason" in resp.content.decode()
    assert not Accelerator.objects.get(pk=acc.pk).isolated


def test_node_page_shows_the_latest_check_run_with_fixes(viewer_client):
    from console.inventory.models import NodeCheckRun

    node = make_node("n1")
    NodeCheckRun.objects.create(
        node=node,
        status="failed",
        trigger="agent-start",
        results=[
            {
                "name": "driver-devices",
                "ok": False,
                "evidence": "0 /dev/davinciN",
                "fix": "load the NPU driver",
            },
            {"name": "cann", "ok": True, "evidence": "present", "fix": ""},
        ],
    )
    body = viewer_client.get("/nodes/n1/").content.decode()
    assert "driver-devices" in body and "load the NPU driver" in body and "agent-start" in body


def test_run_checks_button_records_a_pending_run(operator_client, redis_url):
    from console.inventory.models import NodeCheckRun

    make_node("n1")
    operator_client.post("/nodes/n1/checks")
    run = NodeCheckRun.objects.get(node__name="n1")
    assert (run.status, run.requested_by) == ("pending", "otto")


def test_pages_render_and_say_so_when_redis_is_down(viewer_client, settings):
    make_node("n1", npus=1)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    for path in ("/", "/nodes/n1/"):
        resp = viewer_client.get(path)
        assert resp.status_code == 200
        assert "live telemetry unavailable" in resp.content.decode()


def test_node_page_says_the_clock_is_being_measured_not_failed(viewer_client):
    from datetime import UTC, datetime

    from console.inventory.checks import store_results

    make_node("n1")
    report = {"node": "n1", "sent_at": datetime.now(UTC).isoformat(), "trigger": "agent-start"}
    store_results({**report, "results": [{"name": "cann", "ok": True, "evidence": "present"}]})
    body = viewer_client.get("/nodes/n1/").content.decode()
    assert 'data-testid="clock-measuring">measuring<' in body and "badge--crit" not in body
