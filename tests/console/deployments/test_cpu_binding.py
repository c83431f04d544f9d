"""cpu_binding "numa": checked at create against the NPUs' reported NUMA nodes, decided at
placement (one node when possible, both when a replica spans two, skipped with a reason when
the NPUs say nothing), carried to the agent as EngineSpec.numa_nodes."""

from __future__ import annotations

import pytest

from console.accounts.services import Actor
from console.deployments import services
from console.deployments.engines import build_spec, dispatch_start
from console.deployments.models import Deployment, Replica, ReplicaEvent
from console.deployments.reconcile import reconcile
from console.deployments.schemas import DeploymentIn, DeploymentOut
from console.errors import Invalid
from console.inventory.models import Accelerator
from tests.console.deployments.test_scheduling import SPEC
from tests.factories import make_node

pytestmark = pytest.mark.django_db
LAYOUT = [{"node": 0, "cpus": "0-47", "memory_mb": None}, {"node": 1, "cpus": "48-95"}]


@pytest.fixture
def actor(operator):
    return Actor(user=operator, name="otto")


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    """What dispatch_start would send to the agent (the spec as JSON), per replica."""
    out: dict[int, dict] = {}
    monkeypatch.setattr(
        "console.deployments.engines.send_on_commit",
        lambda node, task, args: out.__setitem__(args[0]["replica_id"], args[0]),
    )
    monkeypatch.setattr("console.deployments.reconcile.dispatch_start", dispatch_start)
    return out


def numa_node(name="a", npus=8, layout=LAYOUT, nodes=(0, 0, 0, 1, 1, 1, 1, 1)):
    """A node whose NPU i is on NUMA node nodes[i] (None: not reported)."""
    node = make_node(name, npus=npus, numa_nodes=layout)
    for acc in Accelerator.objects.filter(node=node):
        acc.numa_node = nodes[acc.npu_id]
        acc.save(update_fields=["numa_node"])
    return node


def deploy(actor, **spec):
    payload = DeploymentIn(name="d1", **SPEC | {"replicas": 1, "cpu_binding": "numa"} | spec)
    return services.create_deployment(actor=actor, payload=payload)


def start(actor, **spec) -> Replica:
    deploy(actor, **spec)
    services.set_desired(actor=actor, name="d1", state="running")
    reconcile()
    return Replica.objects.select_related("node", "deployment").get()


def scheduled_reason(replica: Replica) -> str:
    return ReplicaEvent.objects.get(replica=replica, to_state="scheduled").reason


def test_off_by_default_and_in_the_api_shape(actor, fake_inspect):
    make_node("a", npus=2)
    dep = services.create_deployment(actor=actor, payload=DeploymentIn(name="d1", **SPEC))
    assert dep.cpu_binding == "off"
    assert DeploymentOut.from_orm(Deployment.objects.get()).cpu_binding == "off"


def test_the_replica_goes_on_one_node_and_is_bound_to_it(actor, fake_inspect, sent):
    numa_node(nodes=(0, 1, 1, 0, 1, 1, 1, 1))
    replica = start(actor, npus_per_replica=2)
    assert sorted(replica.npu_list) == [0, 3]  # not NPUs 0 and 1: they sit on two nodes
    assert scheduled_reason(replica).endswith("; CPU binding: NUMA node 0")
    assert build_spec(replica).numa_nodes == [0]
    assert sent[replica.pk]["numa_nodes"] == [0]


def test_npus_spanning_two_nodes_bind_to_both(actor, fake_inspect, sent):
    numa_node()
    replica = start(actor, pinned_node="a", npu_ids=[2, 3], npus_per_replica=2)
    assert sorted(replica.npu_list) == [2, 3]
    assert "CPU binding: NUMA node 0,1" in scheduled_reason(replica)
    assert sent[replica.pk]["numa_nodes"] == [0, 1]


def test_pinned_npus_without_a_numa_node_are_refused_at_create(actor, fake_inspect):
    numa_node(nodes=(0, None, 1, 1, 1, 1, 1, 1))
    with pytest.raises(Invalid) as err:
        deploy(actor, pinned_node="a", npu_ids=[0, 1], npus_per_replica=2)
    assert err.value.field == "cpu_binding"
    assert "cannot bind CPUs: NPU 1 on a reports no NUMA node" in str(err.value)
    assert not Deployment.objects.exists()


def test_a_pinned_node_whose_npus_report_nothing_is_refused(actor, fake_inspect):
    make_node("a", npus=4)  # an agent that predates the facts
    with pytest.raises(Invalid, match="no NPU on a reports a NUMA node") as err:
        deploy(actor, pinned_node="a")
    assert err.value.field == "cpu_binding"


def test_binding_is_for_npu_engines_only(actor, fake_inspect):
    make_node("a", npus=2)
    with pytest.raises(Invalid, match="device npu only"):
        deploy(actor, device="cpu", tensor_parallel_size=1, npus_per_replica=1)


def test_unknown_nodes_skip_the_binding_with_an_event(actor, fake_inspect, sent):
    make_node("a", npus=4)  # unpinned: decided at placement
    replica = start(actor)
    reason = scheduled_reason(replica)
    assert "CPU binding skipped: NPU 0,1 on a reports no NUMA node" in reason
    assert build_spec(replica).numa_nodes == []
    assert "numa_nodes" not in sent[replica.pk]  # an agent without the field takes the spec


def test_a_node_outside_the_hosts_layout_is_not_bound_to(actor, fake_inspect, sent):
    numa_node(nodes=(5,) * 8)  # the chips say node 5, the host's layout has 0 and 1
    replica = start(actor)
    assert "CPU binding skipped: NUMA node 5 is not in a's layout (nodes 0,1)" in (
        scheduled_reason(replica)
    )
    assert "numa_nodes" not in sent[replica.pk]


def test_form_and_detail_page(operator_client, fake_inspect):
    numa_node()
    form = operator_client.get("/deployments/new").content.decode()
    assert 'name="cpu_binding"' in form and 'value="numa"' in form
    post = {"name": "d1", "model_path": "/models/m", "served_model_name": "m", "device": "npu"}
    post |= {"tensor_parallel_size": "2", "npus_per_replica": "2", "max_model_len": "4096"}
    resp = operator_client.post("/deployments/new", post | {"cpu_binding": "numa"})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert Deployment.objects.get().cpu_binding == "numa"
    page = operator_client.get("/deployments/d1/").content.decode()
    assert 'data-testid="cpu-binding"' in page
