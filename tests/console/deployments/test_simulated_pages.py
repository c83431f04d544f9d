"""Replicas on SIMULATED nodes (make demo): labelled as such wherever a replica is shown, and
never asked for a completion (their engines are simulated: nothing answers on the port)."""

from __future__ import annotations

import pytest

from console.deployments.models import Deployment, Replica
from tests.factories import make_node


@pytest.fixture
def replicas(db) -> tuple[Replica, Replica]:
    """Two ready replicas of one deployment: on a simulated node and on a real one."""
    dep = Deployment.objects.create(name="mixed", model_path="/m", served_model_name="m")
    sim = make_node("demo-sim", npus=2, simulated=True)
    real = make_node("kp-01", npus=2)
    return (
        Replica.objects.create(deployment=dep, index=0, node=sim, port=8100, state="ready"),
        Replica.objects.create(deployment=dep, index=1, node=real, port=8100, state="ready"),
    )


def test_a_replica_on_a_simulated_node_is_labelled_and_shows_no_process(viewer_client, replicas):
    page = viewer_client.get("/deployments/mixed/").content.decode()
    sim_card, real_card = page.split('data-testid="replica"')[1:3]
    assert 'data-testid="replica-simulated"' in sim_card and "none (simulated engine)" in sim_card
    assert "replica-simulated" not in real_card and "pid " in real_card
    log = viewer_client.get(f"/replicas/{replicas[0].pk}/logs/").content.decode()
    assert 'data-testid="replica-simulated"' in log
    real_log = viewer_client.get(f"/replicas/{replicas[1].pk}/logs/").content.decode()
    assert "replica-simulated" not in real_log


def test_try_a_prompt_never_asks_a_simulated_replica(operator_client, replicas):
    Replica.objects.filter(pk=replicas[1].pk).update(state="stopped")
    resp = operator_client.post("/deployments/mixed/try", {"prompt": "hi"}, HTTP_HX_REQUEST="true")
    body = resp.content.decode()
    assert resp.status_code == 200 and "SIMULATED nodes" in body and "no server answers" in body
