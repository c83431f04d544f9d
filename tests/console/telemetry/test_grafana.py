"""deploy/grafana/npu-console.json queries only metrics that /metrics really exports: every
PromQL expression's metric names are looked up in a real scrape of a populated fleet."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client

from console.deployments.models import NpuAllocation
from console.inventory.models import Accelerator
from tests.console.telemetry.builders import chip
from tests.console.telemetry.test_metrics import beat, token_for
from tests.factories import make_deployment, make_node

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana" / "npu-console.json"
# PromQL words that are not metric names: aggregations, functions (followed by "("), set and
# grouping keywords
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "sum", "count", "avg", "min", "max", "topk", "bottomk", "quantile",
    "stddev", "stdvar", "count_values", "group", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers left once strings, label
    matchers, range selectors, grouping label lists, function calls and keywords are out."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", expr)
    expr = re.sub(r"\$\w+", "", expr)  # Grafana variables
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word, rest = m.group(), expr[m.end() :].lstrip()
        if word.lower() in KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        text = query.get("query") if isinstance(query, dict) else None
        if var["type"] == "query" and text:
            inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", text)
            exprs.append(inner[1] if inner else text)
    return exprs


def test_the_metric_name_parser():
    expr = (
        'sum by (deployment) (npu_chip_info_hbm_used_memory{node=~"$node"} * on (node, npu, '
        "chip) group_left (deployment) npc_npu_replica_info) or vector(0) + "
        'rate(npc_node_refusals_total{reason="a b"}[5m])'
    )
    assert metric_names(expr) == {
        "npu_chip_info_hbm_used_memory",
        "npc_npu_replica_info",
        "npc_node_refusals_total",
    }


@pytest.fixture
def scrape(hot, db, viewer) -> dict[str, int]:
    """Family -> number of samples in a real scrape of a fleet with every kind of fact."""
    from console.diagnosis.models import Incident

    layout = [{"node": 0, "cpus": "0-23", "memory_mb": 128000}]
    node = make_node("g1", npus=2, numa_nodes=layout)
    Accelerator.objects.filter(node=node).update(numa_node=0)
    dep = make_deployment("qwen", ports=[8100], node=node)
    NpuAllocation.objects.create(
        accelerator=Accelerator.objects.get(node=node, npu_id=0), replica=dep.replica_set.get()
    )
    beat(node, [chip(0, hugepages_used=5, hugepages_total=10), chip(1)])
    Incident.objects.create(category="engine", title="t", fingerprint="fp")
    text = Client().get("/metrics", **token_for(viewer)).content.decode()
    families = {line.split()[2]: 0 for line in text.splitlines() if line.startswith("# TYPE")}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group()
            families[name] = families.get(name, 0) + 1
    return families


def test_every_dashboard_query_reads_metrics_the_console_exports(scrape):
    dashboard = json.loads(DASHBOARD.read_text())
    used = set().union(*(metric_names(e) for e in expressions(dashboard)))
    assert len(used) >= 10
    missing = sorted(used - set(scrape))
    assert not missing, f"the dashboard queries metrics /metrics does not export: {missing}"
    # and each has samples in a fleet that has every kind of fact (refusals: none happened)
    empty = sorted(n for n in used if not scrape[n] and n != "npc_node_refusals_total")
    assert not empty, f"declared but without samples: {empty}"


def test_every_panel_has_a_query_and_a_unique_id():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(
        p["targets"] and all(t["expr"].strip() for t in p["targets"]) for p in dashboard["panels"]
    )
