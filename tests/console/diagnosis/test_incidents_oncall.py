"""Incidents as on-call reads them: one per failing replica (and member host), the lines an
unmatched failure was opened from, the NPU journal's incidents, the timeline (issue 16)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from console.deployments import engines, scheduler
from console.deployments.models import NpuAllocation, ReplicaMember
from console.diagnosis import incidents
from console.diagnosis.models import Incident, IncidentNote
from console.inventory import heartbeats
from console.inventory.models import Accelerator
from tests.kit import make_deployment, make_node, make_replica
from workers.contracts import EngineReport

UNMATCHED_TAIL = [
    "INFO 12:00:01 loading weights shard 1/4",
    "INFO 12:00:09 loading weights shard 2/4",
    "zzz the engine said something no rule knows about",
    "INFO 12:00:12 worker 0 is gone",
]


def _report(replica, node=None, **fields) -> EngineReport:
    values = {
        "node": (node or replica.node).name,
        "replica_id": replica.pk,
        "generation": 1,
        "phase": "failed",
        "reason": "engine exited with code 1",
        "exit_code": 1,
        "at": datetime.now(UTC),
        "log_tail": ["RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB"],
    }
    values.update(fields)
    return EngineReport(**values)


def _hold(replica, *accelerators) -> None:
    for a in accelerators:
        NpuAllocation.objects.create(replica=replica, accelerator=a)


def _five_replicas():
    node = make_node("n5", npus=5)
    dep = make_deployment("chat", replicas=5)
    chips = list(Accelerator.objects.filter(node=node).order_by("npu_id"))
    replicas = []
    for chip in chips:
        replica = make_replica(dep, node=node, state="failed")
        _hold(replica, chip)
        replicas.append(replica)
    return replicas


# --- 1. one incident per replica ------------------------------------------------------------
@pytest.mark.django_db
def test_five_failing_replicas_of_one_deployment_are_five_incidents_each_naming_its_replica():
    replicas = _five_replicas()
    for replica in replicas:
        engines.on_failure(replica, _report(replica))
    opened = Incident.objects.order_by("id")
    assert opened.count() == 5
    for replica, incident in zip(replicas, opened, strict=True):
        assert incident.replica_id == replica.pk
        assert incident.subject.startswith(f"chat replica {replica.index} on n5")
        assert incident.count == 1
    # the queue shows each one with its replica
    assert {i.subject.split(" on ")[0] for i in opened} == {f"chat replica {i}" for i in range(5)}


@pytest.mark.django_db
def test_the_same_replica_failing_again_folds_with_count_and_last_seen():
    replicas = _five_replicas()
    for replica in replicas:
        engines.on_failure(replica, _report(replica))
    third = replicas[2]
    before = Incident.objects.get(replica=third)
    engines.on_failure(third, _report(third, phase="crash-loop", reason="gave up after 5"))
    assert Incident.objects.count() == 5
    after = Incident.objects.get(replica=third)
    assert after.pk == before.pk and after.count == 2 and after.last_seen > before.last_seen
    repeat = IncidentNote.objects.get(incident=after, kind="repeat")
    assert repeat.text.startswith("seen again (2 times): crash-loop: the agent stopped")
    assert repeat.text.endswith("gave up after 5")
    assert after.notes.filter(text__contains="crash-loop").count() == 1  # said once
    assert all(i.count == 1 for i in Incident.objects.exclude(pk=after.pk))


@pytest.mark.django_db
def test_each_failing_member_host_of_a_multi_host_replica_has_its_own_incident():
    leader = make_node("lead", npus=2)
    follower = make_node("follow", npus=2)
    dep = make_deployment("big", nodes_per_replica=2)
    replica = make_replica(dep, node=leader, state="failed")
    ReplicaMember.objects.create(replica=replica, rank=0, node=leader)
    ReplicaMember.objects.create(replica=replica, rank=1, node=follower)
    _hold(replica, *Accelerator.objects.filter(node__in=[leader, follower]))

    a = incidents.open_incident_for_replica(replica, _report(replica, node=follower))
    b = incidents.open_incident_for_replica(replica, _report(replica, node=leader))
    again = incidents.open_incident_for_replica(replica, _report(replica, node=follower))
    assert a.pk != b.pk and again.pk == a.pk
    assert a.node == follower and "rank 1 of 2" in a.subject and "on follow" in a.subject
    assert b.node == leader and "rank 0 of 2" in b.subject
    assert Incident.objects.get(pk=a.pk).count == 2
    # each names the NPUs of its own host
    assert {x.node for x in Incident.objects.get(pk=a.pk).accelerators.all()} == {follower}


# --- 2. the lines an unmatched failure was opened from --------------------------------------
@pytest.mark.django_db
def test_an_unmatched_failure_shows_its_log_lines_on_the_page_and_in_the_api(viewer_client):
    node = make_node("n1", npus=1)
    replica = make_replica(make_deployment("quiet"), node=node, state="unhealthy")
    # first seen unhealthy: a reason, no log tail; then it dies with its tail, still unmatched
    first = _report(replica, phase="unhealthy", reason="health probe failed", log_tail=[])
    incidents.open_incident_for_replica(replica, first)
    incident = incidents.open_incident_for_replica(
        replica, _report(replica, reason="engine exited with code 3", log_tail=UNMATCHED_TAIL)
    )
    assert incident.diagnoses == [] and incident.count == 2

    data = viewer_client.get(f"/api/v1/incidents/{incident.pk}").json()
    shown = [row["text"] for block in data["evidence"] for row in block["context"]]
    assert shown[-len(UNMATCHED_TAIL) :] == UNMATCHED_TAIL
    body = viewer_client.get(f"/incidents/{incident.pk}/").content.decode()
    evidence = body.split('id="evidence"')[1].split("<h2")[0]
    for line in UNMATCHED_TAIL:
        assert line in evidence
    assert "No rule matched this failure" in body and "The lines it was opened from" in body


@pytest.mark.django_db
def test_an_unmatched_failure_without_any_line_says_so_and_links_the_log(viewer_client):
    node = make_node("n1", npus=1)
    replica = make_replica(make_deployment("mute"), node=node, state="failed")
    incident = incidents.open_incident_for_replica(
        replica, _report(replica, reason="", exit_code=None, log_tail=[])
    )
    body = viewer_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "reported no log lines" in body and f"/replicas/{replica.pk}/logs/" in body


# --- 3. the NPU journal's incidents ---------------------------------------------------------
def _inventory(npu_id: int, health: str) -> dict:
    return {
        "npu_id": npu_id,
        "chip_id": 0,
        "logic_id": npu_id,
        "phy_id": npu_id,
        "vendor": "huawei",
        "model_name": "910B3",
        "health": health,
        "hbm_total_mb": 65536,
        "memory_total_mb": None,
        "bus_id": f"0000:C{npu_id + 1}:00.0",
    }


@pytest.mark.django_db
def test_the_npu_journal_lists_a_chip_fault_seen_on_the_nodes_first_beat(viewer_client):
    node = make_node("fresh")  # no chip rows yet: the first beat brings them, one sick
    heartbeats.sync_accelerators(
        node.pk, [_inventory(0, "OK"), _inventory(1, "Alarm")], datetime.now(UTC)
    )
    incident = Incident.objects.get(category="npu-health")
    sick = Accelerator.objects.get(node=node, npu_id=1)
    healthy = Accelerator.objects.get(node=node, npu_id=0)
    body = viewer_client.get(f"/accelerators/{sick.pk}/journal/").content.decode()
    assert f"/incidents/{incident.pk}/" in body and "No incidents" not in body
    body = viewer_client.get(f"/accelerators/{healthy.pk}/journal/").content.decode()
    assert f"/incidents/{incident.pk}/" not in body and "No incidents" in body


@pytest.mark.django_db
def test_the_npu_journal_lists_failures_of_replicas_that_held_it_after_release(viewer_client):
    node = make_node("n2", npus=2)
    held, other = Accelerator.objects.filter(node=node).order_by("npu_id")
    replica = make_replica(make_deployment("d"), node=node, state="failed")
    _hold(replica, held)
    incident = incidents.open_incident_for_replica(replica, _report(replica))
    assert incident.subject == f"d replica 0 on n2, NPU {held.npu_id}"
    scheduler.release(replica)  # the chips are free again; the journal still remembers
    body = viewer_client.get(f"/accelerators/{held.pk}/journal/").content.decode()
    assert f"/incidents/{incident.pk}/" in body and "No incidents" not in body
    assert (
        f"/incidents/{incident.pk}/"
        not in viewer_client.get(f"/accelerators/{other.pk}/journal/").content.decode()
    )
    page = viewer_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert f"/accelerators/{held.pk}/journal/" in page  # and the incident links the NPU


# --- 4. the timeline ------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_timeline_lists_opened_notes_repeats_and_actions_in_order(operator, operator_client):
    node = make_node("n3", npus=1)
    replica = make_replica(make_deployment("tl"), node=node, state="failed")
    incident = incidents.open_incident_for_replica(replica, _report(replica))
    operator_client.post(f"/incidents/{incident.pk}/ack")
    incidents.open_incident_for_replica(replica, _report(replica, reason="exited again"))
    operator_client.post(f"/incidents/{incident.pk}/note", {"text": "line one\nline two"})
    operator_client.post(f"/incidents/{incident.pk}/resolve")

    body = operator_client.get(f"/incidents/{incident.pk}/").content.decode()
    timeline = body.split('data-testid="incident-timeline"')[1].split("</ol>")[0]
    kinds = [part.split('"')[0] for part in timeline.split('data-kind="')[1:]]
    assert kinds == ["opened", "action", "repeat", "note", "action"]
    assert "line one\nline two" in timeline  # kept as typed, shown with pre-wrap
    assert "seen again (2 times): failed: exited again" in timeline
    assert ">acknowledged<" in timeline and ">resolved<" in timeline
    notes = operator_client.get(f"/api/v1/incidents/{incident.pk}").json()["notes"]
    assert [n["kind"] for n in notes] == kinds[1:]


@pytest.mark.django_db
def test_repeats_past_the_listed_ones_are_counted_not_listed(viewer_client, monkeypatch):
    monkeypatch.setattr(incidents, "MAX_REPEAT_NOTES", 2)
    node = make_node("n4", npus=1)
    replica = make_replica(make_deployment("loop"), node=node, state="failed")
    for _ in range(6):
        incident = incidents.open_incident_for_replica(replica, _report(replica))
    assert incident.count == 6
    assert IncidentNote.objects.filter(incident=incident, kind="repeat").count() == 2
    body = viewer_client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "3 more repeats folded without an entry of their own" in body
