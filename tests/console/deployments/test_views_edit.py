"""The deployment edit page (issue 16) and the summary at the top of a deployment's page.

Edits go through services.update_deployment, the API's PUT: the tests assert what a saved
form did to the row and the audit log, and that a refused one changed neither."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from console.accounts.models import AuditEntry
from console.accounts.services import Actor
from console.deployments import services
from console.deployments.models import Deployment, NpuAllocation, ReplicaEvent
from console.deployments.schemas import DeploymentIn
from console.deployments.views import replica_summary
from tests.kit import make_deployment, make_node, make_replica

SECRET = "hf_do-not-show"


def _create(operator, **spec) -> Deployment:
    values = {
        "name": "r1-7b",
        "model_path": "/models/r1-7b",
        "served_model_name": "r1-7b",
        "max_model_len": 8192,
        "extra_env": {"HF_TOKEN_X": SECRET, "VLLM_LOGGING_LEVEL": "INFO"},
        "extra_args": ["--hf-token", SECRET, "--enable-prefix-caching"],
        "preflight_override": "api-only, kept",
        "reschedule_on_node_loss": True,
    }
    payload = DeploymentIn(**(values | spec))
    return services.create_deployment(actor=Actor(user=operator, name="otto"), payload=payload)


def _form(client, name: str = "r1-7b") -> dict[str, str]:
    """The edit form as the browser would post it untouched: every field's shown value."""
    from console.deployments.forms import initial_from

    return {k: str(v) for k, v in initial_from(Deployment.objects.get(name=name)).items() if v}


def test_the_edit_form_is_filled_from_the_deployment_with_secrets_masked(
    operator_client, operator, fake_inspect
):
    make_node("kp-01", npus=8)
    _create(operator)
    body = operator_client.get("/deployments/r1-7b/edit").content.decode()
    assert SECRET not in body
    assert "HF_TOKEN_X=***" in body and "--hf-token" in body
    assert 'id="name" name="name" readonly value="r1-7b"' in body
    assert 'value="8192"' in body and 'name="reschedule_on_node_loss" checked' in body
    assert 'name="desired_state"' not in body  # an edit never starts or stops
    assert (
        'href="/deployments/r1-7b/edit"'
        in operator_client.get("/deployments/r1-7b/").content.decode()
    )


def test_viewers_cannot_edit(viewer_client, operator, fake_inspect):
    make_node("kp-01", npus=8)
    _create(operator)
    assert viewer_client.get("/deployments/r1-7b/edit").status_code == 403
    assert viewer_client.post("/deployments/r1-7b/edit", {}).status_code == 403
    assert "/edit" not in viewer_client.get("/deployments/r1-7b/").content.decode()


def test_saving_the_form_updates_through_the_api_service(operator_client, operator, fake_inspect):
    make_node("kp-01", npus=8)
    _create(operator)
    form = _form(operator_client) | {"max_model_len": "4096", "name": "renamed"}
    resp = operator_client.post("/deployments/r1-7b/edit", form)
    assert resp.status_code == 302 and resp["Location"] == "/deployments/r1-7b/"
    dep = Deployment.objects.get(name="r1-7b")
    assert not Deployment.objects.filter(name="renamed").exists()
    assert (dep.max_model_len, dep.spec_version, dep.desired_state) == (4096, 2, "stopped")
    # what was shown as *** is kept; what the form does not show is kept
    assert dep.extra_env["HF_TOKEN_X"] == SECRET and dep.extra_args[1] == SECRET
    assert dep.preflight_override == "api-only, kept" and dep.reschedule_on_node_loss
    entry = AuditEntry.objects.get(action="deployment.update")
    assert entry.before["spec"]["max_model_len"] == 8192
    assert entry.after["spec"]["max_model_len"] == 4096 and entry.after["spec_version"] == 2
    assert SECRET not in str(entry.before) + str(entry.after)


def test_a_refused_value_is_named_under_its_field_and_changes_nothing(
    operator_client, operator, fake_inspect
):
    make_node("kp-01", npus=8)
    _create(operator)
    resp = operator_client.post(
        "/deployments/r1-7b/edit", _form(operator_client) | {"tensor_parallel_size": "2"}
    )
    assert resp.status_code == 422
    body = resp.content.decode()
    field = body[body.index('<input id="tensor_parallel_size"') :]
    field = field[: field.index("</div>")]
    assert 'data-testid="field-error"' in field and "NPUs per replica" in field
    assert 'value="2"' in field  # the input is kept
    dep = Deployment.objects.get(name="r1-7b")
    assert (dep.tensor_parallel_size, dep.spec_version) == (1, 1)
    assert not AuditEntry.objects.filter(action="deployment.update").exists()


def test_a_masked_value_with_nothing_stored_behind_it_is_refused(
    operator_client, operator, fake_inspect
):
    make_node("kp-01", npus=8)
    _create(operator)
    form = _form(operator_client)
    form["extra_env"] += "\nHF_TOKEN_NEW=***"
    resp = operator_client.post("/deployments/r1-7b/edit", form)
    assert resp.status_code == 422
    body = resp.content.decode()
    field = body[body.index('<textarea id="extra_env"') :]
    assert "HF_TOKEN_NEW: *** stands for a stored value" in field[: field.index("</div>")]
    assert Deployment.objects.get(name="r1-7b").spec_version == 1


def _mixed(n_nodes: int = 3) -> Deployment:
    dep = make_deployment("big", replicas=9, desired_state="running", npus_per_replica=2)
    nodes = [make_node(f"kp-{i}", npus=8) for i in range(n_nodes)]
    now = timezone.now()
    states = ["ready"] * 4 + ["starting", "loading", "failed", "crash-loop", "stopped"]
    for i, state in enumerate(states):
        node = None if state == "stopped" else nodes[i % n_nodes]
        r = make_replica(
            dep, node=node, state=state, state_changed_at=now - timedelta(minutes=9 - i)
        )
        for chip in node.accelerators.filter(allocation__isnull=True)[:2] if node else []:
            NpuAllocation.objects.create(accelerator=chip, replica=r)
    return dep


def test_the_summary_counts_states_nodes_npus_and_finds_the_last_failure(db):
    dep = _mixed()
    failed = dep.replica_set.get(index=6)
    old = timezone.now() - timedelta(hours=2)
    ReplicaEvent.objects.create(replica=failed, at=old, from_state="ready", to_state="failed")
    replicas = list(
        dep.replica_set.prefetch_related("allocations", "events").select_related("node")
    )
    summary = replica_summary(replicas)
    assert summary["counts"] == {"ready": 4, "starting": 2, "failed": 2, "stopped": 1, "unknown": 0}
    assert summary["nodes"] == ["kp-0", "kp-1", "kp-2"] and summary["npus"] == 16
    last = summary["last_failure"]
    assert last["replica"].index == 7 and last["state"] == "crash-loop"


def test_a_long_page_collapses_the_healthy_cards(viewer_client, db):
    _mixed()
    body = viewer_client.get("/deployments/big/").content.decode()
    assert body.count('data-testid="replica"') == 9
    assert body.count("data-keep-open open>") == 2  # the failed and the crash-looping one
    assert 'data-testid="summary-npus">16<' in body and 'data-testid="last-failure"' in body
    live = viewer_client.get("/deployments/big/", HTTP_HX_REQUEST="true").content.decode()
    assert 'id="replica-summary" class="stack" hx-swap-oob="true"' in live  # refreshed with it


def test_the_live_check_on_the_edit_page_does_not_count_its_own_npus(
    operator_client, operator, fake_inspect
):
    make_node("kp-01", npus=8)
    _create(operator, pinned_node="kp-01", npu_ids=[3])
    form = _form(operator_client)
    checked = operator_client.post("/deployments/validate", form | {"editing": "r1-7b"})
    assert 'data-testid="estimate"' in checked.content.decode()
    as_new = operator_client.post("/deployments/validate", {**form, "name": "other"})
    assert "is pinned by deployment" in as_new.content.decode()  # another one would clash
