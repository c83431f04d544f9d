"""Deployment pages: live validation as the form changes, create, detail, actions."""

from __future__ import annotations

import re

from console.deployments.models import Deployment
from tests.factories import make_node

FORM = {
    "name": "r1-7b",
    "model_path": "/models/r1-7b",
    "served_model_name": "r1-7b",
    "device": "npu",
    "tensor_parallel_size": "1",
    "pipeline_parallel_size": "1",
    "npus_per_replica": "1",
    "gpu_memory_utilization": "0.9",
    "replicas": "1",
    "dtype": "auto",
    "quantization": "",
    "max_model_len": "8192",
}


def test_live_validation_shows_the_estimate_or_the_field_problem(operator_client, fake_inspect):
    make_node("kp-01", npus=8)
    ok = operator_client.post("/deployments/validate", FORM, HTTP_HX_REQUEST="true")
    body = ok.content.decode()
    assert (
        ok.status_code == 200
        and 'data-testid="estimate"' in body
        and "7615616512 parameters" in body
    )
    bad = operator_client.post(
        "/deployments/validate", {**FORM, "block_size": "16MB"}, HTTP_HX_REQUEST="true"
    )
    assert "block size counts tokens" in bad.content.decode()


def test_create_from_the_form_and_see_the_detail_page(operator_client, fake_inspect):
    make_node("kp-01", npus=8)
    resp = operator_client.post("/deployments/new", FORM)
    assert resp.status_code == 302
    dep = Deployment.objects.get(name="r1-7b")
    assert dep.block_size == 128 and dep.desired_state == "stopped"
    page = operator_client.get("/deployments/r1-7b/").content.decode()
    assert "Memory estimate" in page and "Start" in page
    operator_client.post("/deployments/r1-7b/start")
    assert Deployment.objects.get(name="r1-7b").desired_state == "running"


def test_form_errors_keep_the_input_and_name_the_field(operator_client, fake_inspect):
    make_node("kp-01", npus=8)
    resp = operator_client.post("/deployments/new", {**FORM, "tensor_parallel_size": "2"})
    assert resp.status_code == 422
    body = resp.content.decode()
    assert "tensor_parallel_size" in body and 'value="/models/r1-7b"' in body
    assert not Deployment.objects.exists()


def test_viewers_see_deployments_but_cannot_act(viewer_client, operator_client, fake_inspect):
    make_node("kp-01", npus=8)
    operator_client.post("/deployments/new", FORM)
    assert viewer_client.get("/deployments/").status_code == 200
    assert viewer_client.get("/deployments/r1-7b/").status_code == 200
    assert viewer_client.post("/deployments/r1-7b/start").status_code == 403
    assert viewer_client.get("/deployments/new").status_code == 403


def test_replica_log_is_read_from_its_host(viewer_client, operator, fake_inspect, monkeypatch):
    from console.accounts.services import Actor
    from console.deployments import services
    from console.deployments.models import Replica
    from console.deployments.schemas import DeploymentIn

    node = make_node("kp-01", npus=8)
    actor = Actor(user=operator, name="otto")
    spec = {k: v for k, v in FORM.items() if k not in {"name"}}
    spec.update(
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        npus_per_replica=1,
        replicas=1,
        gpu_memory_utilization=0.9,
        max_model_len=8192,
        extra_args=[],
        extra_env={},
        node_selector={},
        npu_ids=[],
        reschedule_on_node_loss=False,
        model_label="",
        block_size=None,
        max_num_seqs=None,
        max_num_batched_tokens=None,
        enforce_eager=False,
        trust_remote_code=False,
    )
    dep = services.create_deployment(actor=actor, payload=DeploymentIn(name="d1", **spec))
    replica = Replica.objects.create(deployment=dep, index=0, node=node, port=8100, state="ready")
    sent = []

    def call(node, task, args, *, timeout):
        sent.append((node, task, args))
        return {"text": "INFO started\\nERROR boom\\n", "path": "/x/gen1-run1.log"}

    monkeypatch.setattr("console.inventory.commands.call", call)
    body = viewer_client.get(
        f"/deployments/d1/replicas/{replica.pk}/log", HTTP_HX_REQUEST="true"
    ).content.decode()
    assert sent == [("kp-01", "host.log_tail", [replica.pk, -32768, 32768])]
    assert "ERROR boom" in body and "lvl-error" in body and "<html" not in body


def test_the_list_shows_each_deployments_replica_states_in_order_and_the_ready_count(
    viewer_client,
):
    from console.deployments.models import Deployment, Replica

    two = Deployment.objects.create(name="two", model_path="/m", served_model_name="m2", replicas=2)
    Replica.objects.create(deployment=two, index=1, state="failed")
    Replica.objects.create(deployment=two, index=0, state="ready")
    Deployment.objects.create(name="none-yet", model_path="/m", served_model_name="m0")
    rows = viewer_client.get("/deployments/", HTTP_HX_REQUEST="true").content.decode()
    two_row, none_row = (
        rows.split('href="/deployments/two/"')[1],
        rows.split('href="/deployments/none-yet/"')[1],
    )
    assert ">1 / 2<" in two_row.split("</tr>")[0]
    badges = re.findall(r'badge--(\w+)">(ready|failed)<', two_row.split("</tr>")[0])
    assert badges == [("ok", "ready"), ("crit", "failed")]  # index order, not insertion
    assert '<span class="muted">none</span>' in none_row.split("</tr>")[0]
