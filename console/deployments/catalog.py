"""The built-in model catalog: DeepSeek models with a preset per card type (catalog.yaml).

Loaded and validated once, at import: a preset that names an unknown card, a dtype the card
lacks, TP x PP x DP != NPUs, more NPUs per host than a node has, expert parallel on a dense
model, or a flag vLLM does not accept fails the console's start with the model and card in the
message. Read-only afterwards.

A preset may span several hosts (`nodes`): its `npus` are the replica's NPUs on all hosts
together, split evenly, with DP a multiple of the hosts — the layout of a deployment's
nodes_per_replica (docs/operations.md, "Replicas over several hosts").
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from console.deployments import validation as v
from console.errors import Invalid, NotFound

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")


class CatalogError(ValueError):
    """catalog.yaml is malformed or a preset contradicts the console's own rules."""


class Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    label: str
    family: Literal["910B", "310P", "A3"]
    memory_mb: int = Field(gt=0)
    memory_kind: Literal["HBM", "DDR"]
    npus_per_node: int = Field(ge=1, le=16)
    dtypes: tuple[str, ...]
    source: str


class Preset(BaseModel):
    """One model on one card: either the engine settings that fit, or why none does."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    fits: bool = True
    blocked_by: Literal["memory", "support"] | None = None
    why: str = ""
    nodes: int = Field(1, ge=1, le=16)  # hosts one replica spans (nodes_per_replica)
    npus: int = Field(1, ge=1, le=128)  # the replica's NPUs, all hosts together
    tensor_parallel_size: int = Field(1, ge=1, le=16)
    pipeline_parallel_size: int = Field(1, ge=1, le=16)
    data_parallel_size: int = Field(1, ge=1, le=64)
    enable_expert_parallel: bool = False
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=16)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: Literal["", "ascend"] = ""
    max_model_len: int | None = Field(None, ge=16)
    gpu_memory_utilization: float = Field(0.9, ge=0.1, le=0.99)
    enforce_eager: bool = False
    extra_args: tuple[str, ...] = ()
    model_path: str = ""
    support: Literal["supported", "experimental", "unverified"] | None = None
    note: str = ""

    @model_validator(mode="after")
    def _complete(self) -> Preset:
        if not self.fits and not (self.why and self.blocked_by):
            raise ValueError("a preset that does not fit needs blocked_by and why")
        if self.fits and (self.support is None or self.max_model_len is None):
            raise ValueError("a preset that fits needs support and max_model_len")
        layout = self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size
        if self.fits and layout != self.npus:
            raise ValueError("TP x PP x DP must equal npus (all hosts together)")
        if self.npus % self.nodes or self.data_parallel_size % self.nodes:
            raise ValueError("npus and DP must split evenly over the nodes (hosts)")
        return self

    @property
    def layout(self) -> str:
        """The replica's shape in words: hosts, NPUs, TP/PP/DP, expert parallel."""
        where = (
            f"{self.nodes} hosts x {self.npus // self.nodes} NPUs"
            if self.nodes > 1
            else f"{self.npus} NPU{'s' if self.npus > 1 else ''}"
        )
        parts = [where, f"TP {self.tensor_parallel_size}"]
        if self.pipeline_parallel_size > 1:
            parts.append(f"PP {self.pipeline_parallel_size}")
        if self.data_parallel_size > 1:
            parts.append(f"DP {self.data_parallel_size}")
        if self.enable_expert_parallel:
            parts.append("expert parallel")
        return " · ".join(parts)

    @property
    def hosts_note(self) -> str:
        """What a replica over several hosts needs besides the fields (empty for one host)."""
        if self.nodes == 1:
            return ""
        return (
            f"{self.nodes} hosts per replica, placed by node labels: members prefer hosts with "
            "the same network-domain label (label them, e.g. the switch they hang off). The "
            "NPU-network preflight must pass on every host before the start "
            "(docs/operations.md); preflight_override is left empty, give a reason there only "
            "to start anyway."
        )


class Moe(BaseModel):
    """Mixture-of-experts sizes from config.json (its names in the comments)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    routed_experts: int = Field(gt=0)  # n_routed_experts
    experts_per_token: int = Field(gt=0)  # num_experts_per_tok
    shared_experts: int = Field(ge=0)  # n_shared_experts
    expert_intermediate_size: int = Field(gt=0)  # moe_intermediate_size
    dense_layers: int = Field(0, ge=0)  # first_k_dense_replace: first layers with a dense MLP


class Model(BaseModel):
    """Architecture facts from the model's published config.json (see catalog.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    hub_id: str
    family: str
    architecture: str
    parameters: int = Field(gt=0)
    active_parameters: int | None = None
    num_hidden_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    max_position_embeddings: int = Field(gt=0)
    torch_dtype: str
    moe: Moe | None = None
    presets: dict[str, Preset]

    @property
    def attention(self) -> str:
        if self.kv_lora_rank:
            return f"MLA (latent {self.kv_lora_rank} + RoPE {self.qk_rope_head_dim})"
        if self.num_key_value_heads < self.num_attention_heads:
            return f"GQA ({self.num_key_value_heads} KV heads)"
        return "MHA"

    @property
    def name(self) -> str:
        return self.hub_id.rsplit("/", 1)[-1]

    def model_info(self) -> dict:
        """The fields the agent's model inspection reports, as the estimate reads them."""
        info = {
            "architectures": [self.architecture],
            "param_count": self.parameters,
            "num_hidden_layers": self.num_hidden_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": self.torch_dtype,
        }
        if self.kv_lora_rank:
            info.update(kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim)
        info["num_experts"] = self.moe.routed_experts if self.moe else 0
        if self.moe:  # config.json's names: what the estimate splits over DP
            info.update(
                n_routed_experts=self.moe.routed_experts,
                num_experts_per_tok=self.moe.experts_per_token,
                n_shared_experts=self.moe.shared_experts,
                moe_intermediate_size=self.moe.expert_intermediate_size,
                first_k_dense_replace=self.moe.dense_layers,
            )
        return info


class Catalog(BaseModel):
    model_config = ConfigDict(frozen=True)
    cards: dict[str, Card]
    models: dict[str, Model]


def _check_preset(model: Model, card: Card, preset: Preset) -> None:
    where = f"{model.id} on {card.id}"
    if not preset.fits:
        return
    per_host = preset.npus // preset.nodes
    if per_host > card.npus_per_node:
        raise CatalogError(f"{where}: {per_host} NPUs per host, a node has {card.npus_per_node}")
    if preset.enable_expert_parallel and model.moe is None:
        raise CatalogError(f"{where}: expert parallel needs a mixture-of-experts model")
    if preset.dtype not in card.dtypes:
        raise CatalogError(f"{where}: dtype {preset.dtype} is not one of {card.dtypes}")
    try:
        v.check_extra_args(list(preset.extra_args))
        if preset.model_path:
            v.check_model_path(preset.model_path)
    except Invalid as exc:
        raise CatalogError(f"{where}: {exc.message}") from None


def parse_catalog(raw: dict) -> Catalog:
    """Build and check a catalog from parsed YAML; CatalogError names what is wrong."""
    try:
        cards = {k: Card(id=k, **c) for k, c in (raw.get("cards") or {}).items()}
        models = {k: Model(id=k, **m) for k, m in (raw.get("models") or {}).items()}
    except (ValidationError, TypeError) as exc:
        raise CatalogError(f"catalog.yaml: {exc}") from None
    if not cards or not models:
        raise CatalogError("catalog.yaml: needs cards and models")
    for model in models.values():
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*", model.id):
            raise CatalogError(f"{model.id!r}: ids are lowercase letters, digits, . and -")
        missing = set(cards) - set(model.presets)
        unknown = set(model.presets) - set(cards)
        if missing or unknown:
            raise CatalogError(
                f"{model.id}: presets missing for {sorted(missing)}, unknown cards {sorted(unknown)}"
            )
        for card_id, preset in model.presets.items():
            _check_preset(model, cards[card_id], preset)
    return Catalog(cards=cards, models=models)


@lru_cache(maxsize=1)
def load_catalog(path: Path = CATALOG_FILE) -> Catalog:
    return parse_catalog(yaml.safe_load(path.read_text(encoding="utf-8")))


def get_model(model_id: str) -> Model:
    model = load_catalog().models.get(model_id)
    if model is None:
        raise NotFound(f"no catalog model {model_id!r}", field="model")
    return model


def get_card(card_id: str) -> Card:
    card = load_catalog().cards.get(card_id)
    if card is None:
        raise NotFound(f"no card type {card_id!r}", field="card")
    return card


def deployment_name(model: Model, card: Card) -> str:
    """A default deployment name: a DNS label from the model and card ids (and the hosts)."""
    nodes = model.presets[card.id].nodes
    hosts = f"{nodes}x" if nodes > 1 else ""
    base = re.sub(r"[^a-z0-9-]+", "-", f"{model.id.replace('deepseek-', '')}-{hosts}{card.id}")
    return base.strip("-")[:63].strip("-")


def preset_spec(model: Model, card: Card) -> dict:
    """The deployment spec fields a fitting preset fills in (the form's and the API's names).
    A preset over several hosts is never pinned and leaves preflight_override empty: the
    NPU-network preflight has to pass, or the operator gives a reason."""
    preset = model.presets[card.id]
    if not preset.fits:
        raise Invalid(f"{model.name} does not fit {card.label}: {preset.why}", field="card")
    return {
        "name": deployment_name(model, card),
        "model_path": preset.model_path or f"/models/{model.name}",
        "model_label": model.hub_id,
        "served_model_name": model.name.lower(),
        "device": "npu",
        "tensor_parallel_size": preset.tensor_parallel_size,
        "pipeline_parallel_size": preset.pipeline_parallel_size,
        "data_parallel_size": preset.data_parallel_size,
        "enable_expert_parallel": preset.enable_expert_parallel,
        "npus_per_replica": preset.npus,
        "nodes_per_replica": preset.nodes,
        "preflight_override": "",
        "max_num_seqs": preset.max_num_seqs,
        "max_num_batched_tokens": preset.max_num_batched_tokens,
        "dtype": preset.dtype,
        "quantization": preset.quantization,
        "max_model_len": preset.max_model_len,
        "gpu_memory_utilization": preset.gpu_memory_utilization,
        "block_size": v.ASCEND_BLOCK_SIZE,
        "enforce_eager": preset.enforce_eager,
        "extra_args": list(preset.extra_args),
    }


def preset_estimate(model: Model, card: Card) -> dict | None:
    """The console's memory estimate for a fitting preset on this card (None if it does not fit)."""
    from console.deployments.estimate import estimate_memory

    preset = model.presets[card.id]
    if not preset.fits:
        return None
    return estimate_memory(
        model.model_info(),
        dtype=preset.dtype,
        quantization=preset.quantization,
        tp=preset.tensor_parallel_size,
        pp=preset.pipeline_parallel_size,
        dp=preset.data_parallel_size,
        max_model_len=preset.max_model_len,
        gpu_memory_utilization=preset.gpu_memory_utilization,
        hbm_total_mb=card.memory_mb,
    )


def preset_out(model: Model, card: Card) -> dict:
    """One preset as the API and the catalog page show it: settings, spec and estimate."""
    preset = model.presets[card.id]
    fields = preset.model_dump()
    if not preset.fits:  # engine fields of a preset that does not fit mean nothing
        for key in (
            "nodes",
            "npus",
            "tensor_parallel_size",
            "data_parallel_size",
            "enable_expert_parallel",
            "max_num_seqs",
            "max_num_batched_tokens",
            "dtype",
            "quantization",
            "max_model_len",
            "gpu_memory_utilization",
            "enforce_eager",
        ):
            fields[key] = None
    fields["extra_args"] = list(preset.extra_args)
    return {
        **fields,
        "layout": preset.layout if preset.fits else "",
        "hosts_note": preset.hosts_note if preset.fits else "",
        "card": card.id,
        "card_label": card.label,
        "spec": preset_spec(model, card) if preset.fits else None,
        "estimate": preset_estimate(model, card),
    }


def model_out(model: Model) -> dict:
    cards = load_catalog().cards
    data = model.model_dump(exclude={"presets"})
    data["attention"] = model.attention
    data["presets"] = [preset_out(model, card) for card in cards.values()]
    return data


CATALOG = load_catalog()  # validated at import: a bad catalog.yaml stops the start
