"""The model catalog: every preset passes the console's own validation and memory estimate on
a node with that card's memory; presets that do not fit are refused by the same code."""

from __future__ import annotations

import re

import pytest
import yaml

from console.deployments import catalog, services
from console.deployments.catalog import CatalogError, load_catalog, parse_catalog
from console.deployments.estimate import estimate_memory
from console.deployments.schemas import DeploymentIn
from console.errors import Invalid
from console.inventory.models import Accelerator
from tests.factories import make_node

CAT = load_catalog()
PAIRS = [(m, c) for m in CAT.models for c in CAT.cards]


def node_with(card: catalog.Card):
    """A node whose chips report memory the way npu-smi does for the card: HBM on 910B,
    DDR only (Memory-Usage column) on 310P."""
    node = make_node(f"n-{card.id}")
    for i in range(card.npus_per_node):
        memory = {"hbm_total_mb": card.memory_mb} if card.memory_kind == "HBM" else {}
        if card.memory_kind == "DDR":
            memory = {"memory_total_mb": card.memory_mb}
        Accelerator.objects.create(
            node=node, npu_id=i, chip_id=0, model_name=card.family, health="OK", **memory
        )
    return node


def checked(spec: dict, node, model: catalog.Model) -> dict:
    """Run a spec through the API schema and services.check_spec (the create path)."""
    payload = DeploymentIn.model_validate({**spec, "pinned_node": node.name})
    return services.check_spec(payload, inspect=lambda n, path: model.model_info()).fields


@pytest.mark.django_db
@pytest.mark.parametrize(("model_id", "card_id"), PAIRS)
def test_every_preset_passes_validation_and_the_estimate_or_says_why_not(model_id, card_id):
    model, card = CAT.models[model_id], CAT.cards[card_id]
    preset = model.presets[card_id]
    node = node_with(card)
    if preset.fits:
        spec = catalog.preset_spec(model, card)
        done = checked(dict(spec, pinned_node=node.name), node, model)
        est = done["estimate"]
        assert est["fits"] and est["hbm_total_mb"] == card.memory_mb
        assert est["need_per_npu_mb"] <= card.memory_mb * preset.gpu_memory_utilization
        assert est["max_sequences_at_full_length"] >= 1  # room beyond one full-length sequence
        assert preset.npus <= card.npus_per_node and preset.dtype in card.dtypes
        return
    assert len(preset.why) > 40
    if preset.blocked_by == "memory":
        # The most generous single-node try (every NPU of a node, W8A8, 0.99, short context)
        # is refused by the console's own estimate: the reason is not a guess.
        best = {
            "name": "try",
            "model_path": f"/models/{model.name}",
            "served_model_name": "try",
            "tensor_parallel_size": card.npus_per_node,
            "npus_per_replica": card.npus_per_node,
            "dtype": card.dtypes[-1],
            "quantization": "ascend",
            "max_model_len": 4096,
            "gpu_memory_utilization": 0.99,
            "pinned_node": node.name,
        }
        with pytest.raises(Invalid, match="does not fit") as exc:
            checked(best, node, model)
        assert exc.value.field == "gpu_memory_utilization"
    else:
        assert preset.blocked_by == "support" and "vllm-ascend" in preset.why


def test_mla_kv_cache_is_the_latent_per_layer_and_not_split_by_tp():
    v3 = CAT.models["deepseek-v3"].model_info()
    one = estimate_memory(
        v3,
        dtype="bfloat16",
        quantization="",
        tp=1,
        pp=1,
        max_model_len=1000,
        gpu_memory_utilization=0.9,
        hbm_total_mb=None,
    )
    eight = estimate_memory(
        v3,
        dtype="bfloat16",
        quantization="",
        tp=8,
        pp=1,
        max_model_len=1000,
        gpu_memory_utilization=0.9,
        hbm_total_mb=None,
    )
    assert one["kv_bytes_per_token_per_npu"] == 61 * (512 + 64) * 2  # 70,272 B, not 1.7 MB
    assert eight["kv_bytes_per_token_per_npu"] == one["kv_bytes_per_token_per_npu"]
    assert eight["weights_per_npu_mb"] == pytest.approx(one["weights_per_npu_mb"] / 8)
    assert one["kv_layout"] == "mla" and "MLA" in one["steps"][1]["formula"]


def test_the_estimate_shows_each_step_with_its_numbers():
    model, card = CAT.models["deepseek-r1-distill-qwen-7b"], CAT.cards["910b-64g"]
    est = catalog.preset_estimate(model, card)
    steps = {s["what"]: s for s in est["steps"]}
    assert "7,615,616,512 parameters x 2 B (bfloat16)" in steps["weights per NPU"]["formula"]
    assert (
        "2 (K and V) x 28 layers x 4 KV heads x 128 head dim x 2 B"
        in (steps["KV cache per token per NPU"]["formula"])
    )
    assert steps["available per NPU"]["mb"] == pytest.approx(65536 * 0.9)
    total = sum(
        steps[k]["mb"]
        for k in (
            "weights per NPU",
            "KV cache for one full-length sequence",
            "activation / workspace reserve",
        )
    )
    assert steps["needed per NPU"]["mb"] == pytest.approx(total, abs=0.2)


def raw_catalog() -> dict:
    return yaml.safe_load(catalog.CATALOG_FILE.read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m, c: m["presets"]["910b-64g"].update(dtype="bfloat16") or c, None),
        (lambda m, c: m["presets"]["300i-duo"].update(dtype="bfloat16"), "dtype bfloat16"),
        (lambda m, c: m["presets"]["910b-64g"].update(npus=2), "TP x PP must equal npus"),
        (lambda m, c: m["presets"]["910b-64g"].update(extra_args=["--made-up"]), "--made-up"),
        (lambda m, c: m["presets"]["910b-64g"].update(extra_args=["--dtype", "half"]), "field"),
        (lambda m, c: m["presets"].pop("300i-pro"), "presets missing"),
        (
            lambda m, c: m["presets"]["910b-64g"].update(npus=16, tensor_parallel_size=16),
            "a node has 8",
        ),
        (lambda m, c: m["presets"]["910b-64g"].update(fits=False), "blocked_by and why"),
    ],
)
def test_a_bad_catalog_is_refused_at_load_naming_the_model_and_card(change, message):
    raw = raw_catalog()
    model = raw["models"]["deepseek-r1-distill-qwen-7b"]
    change(model, raw["cards"])
    if message is None:
        assert parse_catalog(raw).models["deepseek-r1-distill-qwen-7b"]  # the control: loads
        return
    with pytest.raises(CatalogError, match=message.replace("-", r"\-")):
        parse_catalog(raw)


def test_catalog_api_lists_models_and_cards_with_specs_that_create_deployments(
    viewer_client, operator_client, db, monkeypatch
):
    body = viewer_client.get("/api/v1/catalog").json()
    assert {c["id"] for c in body["cards"]} == set(CAT.cards)
    assert {m["id"] for m in body["models"]} == set(CAT.models)
    one = viewer_client.get("/api/v1/catalog/deepseek-r1-distill-qwen-14b")
    assert one.status_code == 200
    presets = {p["card"]: p for p in one.json()["presets"]}
    assert presets["910b4-32g"]["spec"]["tensor_parallel_size"] == 2
    assert presets["910b4-32g"]["estimate"]["fits"] is True
    v3 = {p["card"]: p for p in viewer_client.get("/api/v1/catalog/deepseek-v3").json()["presets"]}
    assert v3["910b-64g"]["fits"] is False and v3["910b-64g"]["spec"] is None
    missing = viewer_client.get("/api/v1/catalog/gpt-5")
    assert missing.status_code == 404 and missing.json()["field"] == "model"

    # The spec a preset gives is accepted as-is by POST /deployments (the same validation).
    model = CAT.models["deepseek-r1-distill-qwen-14b"]
    monkeypatch.setattr(
        "console.deployments.services.inspect_model", lambda node, path: model.model_info()
    )
    node_with(CAT.cards["910b4-32g"])
    created = operator_client.post(
        "/api/v1/deployments", presets["910b4-32g"]["spec"], content_type="application/json"
    )
    assert created.status_code == 201, created.content
    assert created.json()["estimate"]["fits"] and created.json()["npus_per_replica"] == 2


def test_catalog_page_shows_fits_and_why_not(viewer_client, db):
    page = viewer_client.get("/catalog/").content.decode()
    assert page.count('data-testid="catalog-row"') == len(CAT.models)
    assert page.count('data-fits="no"') == sum(
        not p.fits for m in CAT.models.values() for p in m.presets.values()
    )
    assert "8 x 64 GB" in page and "deepseek-ai/DeepSeek-V2-Lite-Chat" in page


def test_the_picker_prefills_the_form_or_says_why_not(operator_client, viewer_client, db):
    url = "/deployments/new/catalog"
    resp = operator_client.get(
        url, {"model": "deepseek-r1-distill-qwen-32b", "card": "910b4-32g"}, HTTP_HX_REQUEST="true"
    )
    body = resp.content.decode()
    assert resp.status_code == 200
    assert 'value="/models/DeepSeek-R1-Distill-Qwen-32B-W8A8"' in body
    assert (
        '<option value="ascend" selected>' in body and '<option value="bfloat16" selected>' in body
    )
    assert re.search(r'<input id="tensor_parallel_size" [^>]*min="1" max="64"[^>]* value="2"', body)
    assert "--reasoning-parser deepseek_r1" in body and 'data-testid="estimate-steps"' in body
    refused = operator_client.get(url, {"model": "deepseek-r1", "card": "910b-64g"})
    assert refused.status_code == 422 and "8 x 64 GB node" in refused.content.decode()
    unknown = operator_client.get(url, {"model": "nope", "card": "910b-64g"})
    assert unknown.status_code == 422 and "no catalog model" in unknown.content.decode()
    assert viewer_client.get(url, {"model": "deepseek-r1", "card": "910b-64g"}).status_code == 403
