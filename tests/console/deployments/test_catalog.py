"""The model catalog: every preset passes the console's own validation and memory estimate on
a node with that card's memory (a multi-host preset: on hosts of that card, placed by labels);
presets that do not fit are refused by the same code."""

from __future__ import annotations

import json
import re
import struct

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


def node_with(card: catalog.Card, name: str = ""):
    """A node whose chips report memory the way npu-smi does for the card: HBM on 910B,
    DDR only (Memory-Usage column) on 310P; an A3 as npu-smi shows it, `Ascend910` with two
    dies (chip 0 and 1) per NPU, 65536 MB HBM each."""
    node = make_node(name or f"n-{card.id}", labels={"network-domain": "leaf-1"})
    dies = 2 if card.family == "A3" else 1
    for i in range(card.npus_per_node):
        memory = {"hbm_total_mb": card.memory_mb} if card.memory_kind == "HBM" else {}
        if card.memory_kind == "DDR":
            memory = {"memory_total_mb": card.memory_mb}
        Accelerator.objects.create(
            node=node,
            npu_id=i // dies,
            chip_id=i % dies,
            model_name="Ascend910" if card.family == "A3" else card.family,
            health="OK",
            **memory,
        )
    return node


def checked(spec: dict, node, model: catalog.Model) -> dict:
    """Run a spec through the API schema and services.check_spec (the create path). A replica
    over several hosts is placed by labels, never pinned: the check inspects on any match."""
    pin = {} if spec.get("nodes_per_replica", 1) > 1 else {"pinned_node": node.name}
    payload = DeploymentIn.model_validate({**spec, **pin})
    return services.check_spec(payload, inspect=lambda n, path: model.model_info()).fields


@pytest.mark.django_db
@pytest.mark.parametrize(("model_id", "card_id"), PAIRS)
def test_every_preset_passes_validation_and_the_estimate_or_says_why_not(model_id, card_id):
    model, card = CAT.models[model_id], CAT.cards[card_id]
    preset = model.presets[card_id]
    node = node_with(card)
    if preset.fits:
        for i in range(1, preset.nodes):  # the other hosts of a multi-host replica
            node_with(card, f"n-{card.id}-{i}")
        spec = catalog.preset_spec(model, card)
        assert spec["nodes_per_replica"] == preset.nodes and "pinned_node" not in spec
        done = checked(spec, node, model)
        est = done["estimate"]
        assert est["fits"] and est["hbm_total_mb"] == card.memory_mb
        assert est["need_per_npu_mb"] <= card.memory_mb * preset.gpu_memory_utilization
        assert est["max_sequences_at_full_length"] >= 1  # room beyond one full-length sequence
        assert est == catalog.preset_estimate(model, card)  # the page shows what create checks
        assert preset.npus // preset.nodes <= card.npus_per_node and preset.dtype in card.dtypes
        assert done["pinned_node"] is None if preset.nodes > 1 else done["pinned_node"] == node
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
        (lambda m, c: m["presets"]["910b-64g"].update(npus=2), "TP x PP x DP must equal npus"),
        (
            lambda m, c: m["presets"]["910b-64g"].update(npus=2, data_parallel_size=2),
            None,  # DP 2 x TP 1 on one host: a valid layout
        ),
        (
            lambda m, c: m["presets"]["910b-64g"].update(npus=3, data_parallel_size=3, nodes=2),
            "split evenly over the nodes",
        ),
        (
            lambda m, c: m["presets"]["910b-64g"].update(enable_expert_parallel=True),
            "expert parallel needs a mixture-of-experts model",
        ),
        (
            lambda m, c: m["presets"]["910b-64g"].update(npus=32, data_parallel_size=32, nodes=2),
            "16 NPUs per host, a node has 8",
        ),
        (lambda m, c: m["presets"]["910b-64g"].update(extra_args=["--made-up"]), "--made-up"),
        (lambda m, c: m["presets"]["910b-64g"].update(extra_args=["--dtype", "half"]), "field"),
        (lambda m, c: m["presets"].pop("300i-pro"), "presets missing"),
        (
            lambda m, c: m["presets"]["910b-64g"].update(npus=16, tensor_parallel_size=16),
            "16 NPUs per host, a node has 8",
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
    assert v3["910b4-32g"]["fits"] is False and v3["910b4-32g"]["spec"] is None
    two_a2 = v3["910b-64g"]
    assert (two_a2["nodes"], two_a2["npus"], two_a2["data_parallel_size"]) == (2, 16, 4)
    assert two_a2["enable_expert_parallel"] is True and "network-domain" in two_a2["hosts_note"]
    assert two_a2["layout"] == "2 hosts x 8 NPUs · TP 4 · DP 4 · expert parallel"
    assert two_a2["spec"]["nodes_per_replica"] == 2 and two_a2["spec"]["preflight_override"] == ""
    assert two_a2["estimate"]["data_parallel_size"] == 4 and two_a2["estimate"]["fits"]
    assert v3["a3-64g"]["nodes"] == 1 and v3["a3-64g"]["spec"]["data_parallel_size"] == 4
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
    assert "8 x 32 GB" in page and "deepseek-ai/DeepSeek-V2-Lite-Chat" in page
    multi_host = [p for m in CAT.models.values() for p in m.presets.values() if p.nodes > 1]
    assert len(multi_host) == 2  # DeepSeek-V3 and R1 on two Atlas 800 A2
    assert page.count('data-testid="catalog-hosts"') == len(multi_host)
    assert "2 hosts x 8 NPUs · TP 4 · DP 4 · expert parallel" in page
    assert "16 NPUs · TP 4 · DP 4 · expert parallel" in page  # one Atlas 800 A3


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
    refused = operator_client.get(url, {"model": "deepseek-r1", "card": "910b4-32g"})
    assert refused.status_code == 422 and "8 x 32 GB node" in refused.content.decode()
    unknown = operator_client.get(url, {"model": "nope", "card": "910b-64g"})
    assert unknown.status_code == 422 and "no catalog model" in unknown.content.decode()
    assert viewer_client.get(url, {"model": "deepseek-r1", "card": "910b-64g"}).status_code == 403


def test_the_picker_prefills_a_multi_host_preset(operator_client, db):
    resp = operator_client.get(
        "/deployments/new/catalog",
        {"model": "deepseek-r1", "card": "910b-64g"},
        HTTP_HX_REQUEST="true",
    )
    body = resp.content.decode()
    assert resp.status_code == 200
    assert 'value="/models/DeepSeek-R1-W8A8"' in body and 'value="r1-2x910b-64g"' in body
    assert re.search(r'<input id="nodes_per_replica" [^>]*value="2"', body)
    assert re.search(r'<input id="npus_per_replica" [^>]*value="16"', body)
    for field, value in (
        ("tensor_parallel_size", 4),
        ("data_parallel_size", 4),
        ("max_num_seqs", 16),
        ("max_num_batched_tokens", 4096),
        ("max_model_len", 32768),
    ):
        assert re.search(rf'<input id="{field}" [^>]* value="{value}"', body), field
    assert re.search(r'<input type="checkbox" name="enable_expert_parallel" checked>', body)
    assert not re.search(r'<input type="checkbox" name="enforce_eager" checked>', body)
    assert "--no-enable-prefix-caching --reasoning-parser deepseek_r1" in body
    assert 'data-testid="catalog-hosts-note"' in body and "preflight" in body
    assert "Why this fits 2 hosts of" in body and "routed experts per NPU" in body


MIB = 1024 * 1024


def test_deepseek_v3_w8a8_per_member_estimate_checked_by_hand():
    """Two Atlas 800 A2 (TP 4 x DP 4, 16 NPUs): every NPU holds 16 of the 256 routed experts
    of each MoE layer and a TP-4 quarter of everything else (a copy per DP rank)."""
    model = CAT.models["deepseek-v3"]
    experts = 58 * 256 * 3 * 7168 * 2048  # MoE layers (61 - 3 dense) x experts x gate/up/down
    assert experts == 653_908_770_816
    rest = 671_026_419_200 - experts
    assert rest == 17_117_648_384  # attention, embeddings, 3 dense MLPs, shared experts, gates
    per_npu = experts / 16 + rest / 4  # W8A8: 1 byte per weight
    assert per_npu == 40_869_298_176 + 4_279_412_096  # 45,148,710,272 B
    kv = 61 * (512 + 64) * 2 * 32768  # MLA latent per token x max_model_len, bf16
    assert kv == 2_302_672_896

    est = catalog.preset_estimate(model, CAT.cards["910b-64g"])
    steps = {s["what"]: s for s in est["steps"]}
    assert steps["routed experts per NPU"]["mb"] == pytest.approx(38976.0, abs=0.1)
    assert steps["other weights per NPU"]["mb"] == pytest.approx(4081.2, abs=0.1)
    assert est["weights_per_npu_mb"] == pytest.approx(per_npu / MIB, abs=0.1)  # 43,057.2
    assert est["kv_for_one_sequence_mb"] == pytest.approx(kv / MIB, abs=0.1)  # 2,196.0
    assert est["need_per_npu_mb"] == pytest.approx((per_npu + kv) / MIB + 1024, abs=0.1)
    assert est["need_per_npu_mb"] == pytest.approx(46277.2, abs=0.1)
    assert est["have_per_npu_mb"] == pytest.approx(65536 * 0.9)  # 58,982.4
    assert est["headroom_mb"] == pytest.approx(12705.2, abs=0.1)
    assert est["max_sequences_at_full_length"] == 6
    assert est["routed_expert_parameters"] == experts and est["data_parallel_size"] == 4
    assert "/ (TP 4 x PP 1 x DP 4)" in steps["routed experts per NPU"]["formula"]
    assert "653,908,770,816" in est["how"] and "17,117,648,384" in est["how"]

    a3 = catalog.preset_estimate(model, CAT.cards["a3-64g"])  # one A3: 16 dies, same split
    assert a3["weights_per_npu_mb"] == est["weights_per_npu_mb"]
    assert a3["need_per_npu_mb"] == pytest.approx(43057.2 + 1098.0 + 1024, abs=0.1)  # 16K tokens
    assert a3["have_per_npu_mb"] == pytest.approx(65536 * 0.92)
    assert a3["max_sequences_at_full_length"] == 14

    # The estimate counts every W8A8 weight as 1 byte. msModelSlim keeps some (embeddings, the
    # head, norms) in BF16: even if all 17.1B non-expert weights stayed BF16, it still fits.
    assert est["headroom_mb"] > rest * 1 / 4 / MIB  # 12,705 MB > 4,081 MB more per NPU


def test_single_host_estimates_ignore_the_expert_split():
    """DP 1: the routed experts and the rest share one divisor, so a MoE model's estimate is
    params / (TP x PP) as before, with the same one weights row."""
    lite = CAT.models["deepseek-v2-lite-chat"]
    est = catalog.preset_estimate(lite, CAT.cards["910b4-32g"])
    assert est["weights_per_npu_mb"] == pytest.approx(15_706_484_224 * 2 / 2 / MIB, abs=0.1)
    assert [s["what"] for s in est["steps"]][:2] == [
        "weights per NPU",
        "KV cache per token per NPU",
    ]
    assert est["routed_expert_parameters"] == 0 and est["data_parallel_size"] == 1


def test_dp_without_expert_sizes_counts_every_weight_by_tp_and_says_so():
    info = {k: v for k, v in CAT.models["deepseek-v3"].model_info().items()}
    del info["moe_intermediate_size"]  # what an agent that does not report it would give
    kwargs = dict(
        dtype="bfloat16",
        quantization="ascend",
        tp=4,
        pp=1,
        max_model_len=4096,
        gpu_memory_utilization=0.9,
        hbm_total_mb=65536,
    )
    est = estimate_memory(info, dp=4, **kwargs)
    assert est["weights_per_npu_mb"] == pytest.approx(671_026_419_200 / 4 / MIB, abs=0.1)
    assert not est["fits"] and "over-estimate" in est["steps"][0]["formula"]
    dense = estimate_memory(CAT.models["deepseek-llm-67b-chat"].model_info(), dp=2, **kwargs)
    assert "a full copy on each of the DP 2 ranks" in dense["steps"][0]["formula"]
    assert dense["weights_per_npu_mb"] == pytest.approx(67_425_001_472 / 4 / MIB, abs=0.1)


def test_the_two_host_preset_creates_a_deployment_placed_by_labels(
    operator_client, db, monkeypatch
):
    model, card = CAT.models["deepseek-v3"], CAT.cards["910b-64g"]
    monkeypatch.setattr(
        "console.deployments.services.inspect_model", lambda node, path: model.model_info()
    )
    node_with(card, "a2-0"), node_with(card, "a2-1")
    spec = catalog.preset_spec(model, card)
    created = operator_client.post("/api/v1/deployments", spec, content_type="application/json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["nodes_per_replica"], body["npus_per_replica"], body["pinned_node"]) == (
        2,
        16,
        None,
    )
    assert body["data_parallel_size"] == 4 and body["enable_expert_parallel"] is True
    assert body["preflight_override"] == "" and body["estimate"]["fits"]
    assert body["extra_args"] == ["--no-enable-prefix-caching"]


@pytest.mark.django_db
def test_the_agents_own_reading_of_v3_gives_the_per_member_split(tmp_path):
    """The agent's inspection (workers/engine/inspect.py) of a directory with DeepSeek-V3's
    config.json and a safetensors header of its 671B parameters reports the expert sizes, so
    the create path (services.check_spec) splits the experts over DP as the catalog does."""
    from workers.engine.inspect import clear_cache, inspect_model

    model, card = CAT.models["deepseek-v3"], CAT.cards["910b-64g"]
    config = {  # the published config.json's fields the console reads
        "architectures": [model.architecture],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "max_position_embeddings": 163840,
        "torch_dtype": "bfloat16",
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
    }
    path = tmp_path / "DeepSeek-V3-W8A8"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    header = json.dumps(
        {"w": {"dtype": "I8", "shape": [model.parameters], "data_offsets": [0, 0]}}
    ).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    clear_cache()
    info = inspect_model(str(path))
    assert info["ok"] and info["num_experts"] == 256 and info["moe_intermediate_size"] == 2048
    node_with(card, "a2-0"), node_with(card, "a2-1")
    spec = dict(catalog.preset_spec(model, card), model_path=str(path))
    done = services.check_spec(DeploymentIn.model_validate(spec), inspect=lambda n, p: info)
    assert done.estimate == catalog.preset_estimate(model, card)  # 46,277 of 58,982 MB
