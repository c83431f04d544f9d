"""The weights check before a multi-host replica starts (groups.check_weights): every member's
agent reads the model (a record and a poll, console/deployments/inspection.py) and the
manifests (workers/engine/manifest.py) must be the same; a difference holds nothing and names
the node and the file. Each node's answer here is the agent's real inspection of its own copy,
built in tmp_path, stored as the inbox stores it (inspection.store_answer)."""

from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import pytest

from console.accounts.services import Actor
from console.deployments import groups, inspection
from console.deployments.models import ModelInspection, NpuAllocation, Replica
from console.deployments.reconcile import reconcile
from tests.console.deployments.test_groups import host, start_group
from tests.workers.engine.test_inspect import CONFIG, write_safetensors
from workers.contracts import MANIFEST_SCHEME, InspectionReport
from workers.engine.inspect import inspect_model

SHARD_2 = "model-00002-of-00002.safetensors"


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    """What reconcile dispatches: (task, node)."""
    out = []
    monkeypatch.setattr(
        "console.deployments.engines.send_on_commit",
        lambda node, task, args: out.append((task, node)),
    )
    return out


@pytest.fixture(autouse=True)
def reachable(monkeypatch):
    """The members reach each other (the probes themselves: test_group_network.py)."""
    monkeypatch.setattr(groups, "check_connectivity", lambda r: "")


@pytest.fixture
def actor(operator):
    return Actor(user=operator, name="otto")


@pytest.fixture
def hosts(db):
    return host("a1", "10.0.1.1"), host("a2", "10.0.1.2")


@pytest.fixture
def copies(tmp_path):
    """The model as each host holds it: one directory per node, the same files."""
    made = {}
    for node in ("a1", "a2"):
        d = made[node] = tmp_path / node
        d.mkdir()
        (d / "config.json").write_text(json.dumps(CONFIG))
        (d / "tokenizer.json").write_text("{}")
        write_safetensors(d / "model-00001-of-00002.safetensors", {"embed": [2000, 64]})
        write_safetensors(d / SHARD_2, {"a": [64, 128], "b": [64]})
    return made


def answer(node: str, result: dict) -> None:
    """The node's agent answers its pending inspection, through what the inbox calls."""
    record = ModelInspection.objects.get(node__name=node, status="pending")
    report = InspectionReport.model_validate(
        {"node": node, "inspection_id": record.pk, "path": record.path, "result": result}
    )
    assert inspection.store_answer(report, node=node)


def answer_from(copies: dict) -> None:
    for node, directory in copies.items():
        answer(node, inspect_model(str(directory)))


def test_identical_copies_start_once_every_member_has_answered(
    actor, fake_inspect, hosts, copies, sent
):
    replica = start_group(actor)
    assert replica.state == "pending"
    assert replica.state_reason == "waiting for the model inspection on a1, a2"
    assert not NpuAllocation.objects.exists() and not sent  # the gang's hold was released
    asked = ModelInspection.objects.order_by("node__name")
    assert [(r.node.name, r.path) for r in asked] == [("a1", "/models/m"), ("a2", "/models/m")]

    answer("a1", inspect_model(str(copies["a1"])))
    reconcile()
    replica = Replica.objects.get()
    assert replica.state_reason == "waiting for the model inspection on a2"
    assert ModelInspection.objects.count() == 2  # the pending ask is not repeated

    answer("a2", inspect_model(str(copies["a2"])))
    reconcile()
    assert Replica.objects.get().state == "scheduled"
    assert sorted(n for task, n in sent if task == "host.start_replica") == ["a1", "a2"]


def _rewrite_shard_header(d):
    """Same size and data, another dtype in the header ("BF16" and "FP16" are as long)."""
    write_safetensors(d / SHARD_2, {"a": [64, 128], "b": [64]}, dtype="FP16")


def _flip_a_data_byte(d):
    raw = bytearray((d / SHARD_2).read_bytes())
    raw[-1] ^= 0xFF  # the last byte of the (small) data: inside a sampled window
    (d / SHARD_2).write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("change", "file", "what"),
    [
        pytest.param(
            lambda d: write_safetensors(d / SHARD_2, {"a": [64, 64], "b": [64]}),
            SHARD_2,
            "size ",
            id="shard-size",
        ),
        pytest.param(_rewrite_shard_header, SHARD_2, "safetensors header checksum", id="header"),
        pytest.param(_flip_a_data_byte, SHARD_2, "checksum of the sampled bytes", id="shard-data"),
        pytest.param(
            lambda d: (d / "config.json").write_text(json.dumps({**CONFIG, "vocab_size": 2001})),
            "config.json",
            "checksum",
            id="config",
        ),
    ],
)
def test_a_different_file_on_one_node_holds_nothing_and_names_node_and_file(
    actor, fake_inspect, hosts, copies, sent, change, file, what
):
    start_group(actor)
    change(copies["a2"])
    answer_from(copies)
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "pending" and not NpuAllocation.objects.exists() and not sent
    assert replica.state_reason.startswith(
        "the model at /models/m is not the same on every member: node "
    )
    # compared with the leader's copy: whichever of the two it is, both are named
    assert f"file {file} differs ({what}" in replica.state_reason
    assert "node a1" in replica.state_reason and "node a2" in replica.state_reason


def test_a_missing_file_names_the_node_that_lacks_it(actor, fake_inspect, hosts, copies):
    start_group(actor)
    (copies["a2"] / "tokenizer.json").unlink()
    answer_from(copies)
    reconcile()
    reason = Replica.objects.get().state_reason
    assert "node a2: file tokenizer.json is missing (node a1 has it)" in reason


def test_a_node_that_cannot_read_the_model_is_named(actor, fake_inspect, hosts, copies, tmp_path):
    start_group(actor)
    answer("a1", inspect_model(str(copies["a1"])))
    answer("a2", inspect_model(str(tmp_path / "not-copied")))
    reconcile()
    replica = Replica.objects.get()
    assert replica.state == "pending" and not NpuAllocation.objects.exists()
    assert replica.state_reason.startswith("node a2: model path ")
    assert "does not exist" in replica.state_reason


def test_an_agent_without_manifests_is_asked_to_upgrade(actor, fake_inspect, hosts, copies):
    start_group(actor)
    answer("a1", inspect_model(str(copies["a1"])))
    old = {k: v for k, v in inspect_model(str(copies["a2"])).items() if k != "manifest"}
    answer("a2", old)
    reconcile()
    reason = Replica.objects.get().state_reason
    assert reason.startswith("node a2: its agent sends no manifest") and "upgrade" in reason


# --- the comparison on its own ----------------------------------------------------------------
def manifest(*files: tuple[str, int, str], total: int | None = None, scheme=MANIFEST_SCHEME):
    entries = [{"name": n, "bytes": b, "sha256": c * 64} for n, b, c in files]
    return {
        "scheme": scheme,
        "digest": hashlib.sha256(json.dumps([entries, total]).encode()).hexdigest(),
        "files_total": len(entries) if total is None else total,
        "files": entries,
    }


def test_a_list_cut_at_the_cap_is_compared_only_up_to_its_last_name():
    a = manifest(("a.json", 1, "1"), ("b.json", 1, "1"), total=5)
    b = manifest(("a.json", 1, "1"), ("c.json", 1, "1"), total=4)  # b.json missing on b
    assert groups.manifest_differences("n1", a, "n2", b) == [
        "node n2: file b.json is missing (node n1 has it)"  # c.json: past n1's cut
    ]
    same_listed = manifest(("a.json", 1, "1"), ("b.json", 1, "1"), total=6)
    assert groups.manifest_differences("n1", a, "n2", same_listed) == [
        "node n2: the model's files differ from node n1's past the 2 listed"
    ]


def test_manifests_of_another_scheme_are_not_compared():
    a, b = manifest(("a.json", 1, "1")), manifest(("a.json", 1, "1"), scheme="other-2")
    assert groups.manifest_differences("n1", a, "n2", b) == [
        f"nodes n1 and n2 checksum differently ({MANIFEST_SCHEME} vs other-2): run the same "
        "agent version on both"
    ]


def test_the_reason_names_three_differences_and_counts_the_rest(monkeypatch):
    files = [(f"{i}.py", 1, "1") for i in range(5)]
    a, b = manifest(*files), manifest(*[(n, 2, c) for n, _, c in files])
    monkeypatch.setattr(groups, "member_manifests", lambda r: [("n1", a), ("n2", b)])
    replica = SimpleNamespace(deployment=SimpleNamespace(model_path="/models/m"))
    with pytest.raises(groups.WeightsUnconfirmed) as held:
        groups.check_weights(replica)
    assert str(held.value) == (
        "the model at /models/m is not the same on every member: "
        "node n2: file 0.py differs (size 2 vs 1 bytes) from node n1; "
        "node n2: file 1.py differs (size 2 vs 1 bytes) from node n1; "
        "node n2: file 2.py differs (size 2 vs 1 bytes) from node n1; and 2 more"
    )


def test_the_deployment_keeps_the_model_info_without_the_manifest(actor, fake_inspect, hosts):
    """The manifest is read from each node's inspection when a group is placed; the
    deployment's row and API keep only what describes the model."""
    fake_inspect["manifest"] = manifest(("config.json", 1, "1"))
    start_group(actor)
    info = Replica.objects.get().deployment.model_info
    assert info["architectures"] == ["Qwen2ForCausalLM"] and "manifest" not in info
