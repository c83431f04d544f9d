"""Agent/console version skew: console X.Y supports agents X.Y and X.(Y-1); others are flagged
on the node list, the node page and in the API (docs/operations.md, "Upgrades")."""

from __future__ import annotations

import pytest

import console
from console.inventory.models import AgentSkew, Node, agent_skew
from tests.console.inventory.test_heartbeats import beat, enroll, ingest  # noqa: F401
from tests.factories import make_node


@pytest.mark.parametrize(
    "agent, expected",
    [
        ("1.4.0", AgentSkew.CURRENT),
        ("1.4.7", AgentSkew.CURRENT),  # patch releases never matter
        ("v1.4.1+local", AgentSkew.CURRENT),
        ("1.3.9", AgentSkew.BEHIND),  # N-1: supported, flagged for upgrade
        ("1.2.0", AgentSkew.UNSUPPORTED),  # N-2
        ("1.5.0", AgentSkew.UNSUPPORTED),  # newer than the console: upgrade the console first
        ("2.4.0", AgentSkew.UNSUPPORTED),
        ("0.4.0", AgentSkew.UNSUPPORTED),
        ("garbage", AgentSkew.UNSUPPORTED),
        ("", AgentSkew.UNKNOWN),
    ],
)
def test_skew_policy(agent, expected):
    assert agent_skew(agent, "1.4.2") == expected


def test_previous_major_is_never_one_minor_behind():
    assert agent_skew("0.9.0", "1.0.0") == AgentSkew.UNSUPPORTED


@pytest.fixture
def console_1_4(monkeypatch):
    monkeypatch.setattr(console, "__version__", "1.4.2")


def _fleet() -> None:
    make_node("same", agent_version="1.4.0")
    make_node("behind", agent_version="1.3.5")
    make_node("ancient", agent_version="1.1.0")
    make_node("newer", agent_version="1.5.0")


def test_api_reports_each_nodes_skew(viewer_client, console_1_4):
    _fleet()
    items = viewer_client.get("/api/v1/nodes").json()["items"]
    assert {n["name"]: n["agent_skew"] for n in items} == {
        "ancient": "unsupported",
        "behind": "behind",
        "newer": "unsupported",
        "same": "current",
    }
    assert viewer_client.get("/api/v1/nodes/behind").json()["agent_skew"] == "behind"


def test_node_list_and_page_flag_skewed_agents(viewer_client, console_1_4):
    _fleet()
    rows = viewer_client.get("/nodes/").content.decode().split("<tr")
    row = {
        name: next(r for r in rows if f">{name}</a>" in r) for name in ("same", "behind", "newer")
    }
    assert 'data-testid="agent-skew"' not in row["same"]
    assert "agent behind" in row["behind"] and "badge--warn" in row["behind"]
    assert "agent unsupported" in row["newer"] and "badge--crit" in row["newer"]
    page = viewer_client.get("/nodes/ancient/").content.decode()
    assert "agent unsupported" in page and "1.1.0" in page
    assert 'data-testid="agent-skew"' not in viewer_client.get("/nodes/same/").content.decode()


@pytest.mark.django_db
def test_an_upgraded_agent_clears_the_flag(enroll, console_1_4):  # noqa: F811
    """The version comes from the heartbeat: an agent upgraded in place updates the node."""
    node_id = ingest(beat(enroll, agent_version="1.3.0"))
    assert Node.objects.get(pk=node_id).agent_skew == AgentSkew.BEHIND
    ingest(beat(enroll, agent_version="1.4.1"))
    node = Node.objects.get(pk=node_id)
    assert (node.agent_version, node.agent_skew) == ("1.4.1", AgentSkew.CURRENT)
