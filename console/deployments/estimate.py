"""How much NPU memory a replica needs, and how that was computed (shown to the user).

weights per NPU    = parameters x bytes per weight / (TP x PP)
                     MoE models with data parallel (DP > 1): vLLM spreads the expert layers over
                     all TP x DP NPUs of a replica ("expert layers form an EP or TP group of size
                     DP x TP", vllm-ascend's multi_node.md), while attention, embeddings, dense
                     and shared-expert layers are copied per DP rank and split only by TP, so
                       routed-expert params x bytes / (TP x PP x DP) + the rest x bytes / (TP x PP)
                     with routed-expert params = MoE layers x routed experts x 3 (gate, up, down)
                     x hidden size x expert intermediate size (config.json's n_routed_experts,
                     moe_intermediate_size, first_k_dense_replace, moe_layer_freq). With DP 1
                     both terms share one divisor, so the result is the first line's.
KV cache per token = 2 (K and V) x layers x KV heads x head dim x bytes per element / (TP x PP)
                     MLA models (DeepSeek-V2/V3/R1, config has kv_lora_rank) cache one compressed
                     latent per token instead: layers x (kv_lora_rank + qk_rope_head_dim) x bytes
                     / PP, the same on every TP rank (the latent is not split across heads)
need per NPU       = weights per NPU + KV for one full-length sequence (max_model_len tokens)
                     + a fixed activation / workspace reserve
have per NPU       = memory total x gpu_memory_utilization (HBM on 910B; DDR on 310P)
A replica fits when need <= have; what is left of `have` becomes more KV cache (more sequences).
"""

from __future__ import annotations

BYTES_PER_DTYPE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}
# msModelSlim W8A8 ("ascend") and the usual 8-bit formats store ~1 byte per weight; 4-bit ~0.5.
BYTES_PER_QUANT = {"ascend": 1.0, "fp8": 1.0, "gptq": 0.5, "awq": 0.5, "compressed-tensors": 1.0}
RESERVE_MB = 1024  # activations, graph workspace, HCCL buffers: a conservative flat reserve
MB = 1024 * 1024


def _weight_bytes(info: dict, dtype: str, quantization: str) -> tuple[float, str]:
    """Bytes per weight and why (shown in the explanation)."""
    if quantization in BYTES_PER_QUANT:
        return BYTES_PER_QUANT[quantization], f"--quantization {quantization}"
    if dtype == "auto":
        dtype = str(info.get("torch_dtype") or "bfloat16")
        return BYTES_PER_DTYPE.get(dtype, 2), f"{dtype} (auto: the model's torch_dtype)"
    return BYTES_PER_DTYPE.get(dtype, 2), dtype


def _kv_per_token(info: dict, dtype: str, tp: int, pp: int) -> tuple[float, str]:
    """KV-cache bytes per token per NPU, and the formula with its numbers."""
    kv_dtype = dtype if dtype != "auto" else str(info.get("torch_dtype") or "bfloat16")
    elem = BYTES_PER_DTYPE.get(kv_dtype, 2)
    layers = int(info.get("num_hidden_layers") or 0)
    heads = int(info.get("num_attention_heads") or 1)
    kv_lora = int(info.get("kv_lora_rank") or 0)
    if kv_lora:
        rope = int(info.get("qk_rope_head_dim") or 0)
        per = layers * (kv_lora + rope) * elem / max(1, pp)
        how = (
            f"MLA: {layers} layers x ({kv_lora} latent + {rope} RoPE) x {elem} B / PP {pp} "
            f"(the latent is not split by TP) = {per:,.0f} B"
        )
        return per, how
    kv_heads = int(info.get("num_key_value_heads") or heads)
    head_dim = int(info.get("head_dim") or (int(info.get("hidden_size") or 0) // max(1, heads)))
    split = max(1, tp * pp)
    per = 2 * layers * kv_heads * head_dim * elem / split
    how = (
        f"2 (K and V) x {layers} layers x {kv_heads} KV heads x {head_dim} head dim x {elem} B "
        f"/ (TP {tp} x PP {pp}) = {per:,.0f} B"
    )
    return per, how


def _routed_experts(info: dict) -> tuple[int, str]:
    """Parameters of the routed experts, and how they were counted; (0, "") when the model
    reports no expert sizes (a dense model, or an inspection without moe_intermediate_size)."""
    experts = int(info.get("n_routed_experts") or info.get("num_experts") or 0)
    size = int(info.get("moe_intermediate_size") or 0)
    hidden = int(info.get("hidden_size") or 0)
    layers = int(info.get("num_hidden_layers") or 0)
    if not (experts and size and hidden and layers):
        return 0, ""
    first = int(info.get("first_k_dense_replace") or 0)
    every = max(1, int(info.get("moe_layer_freq") or 1))
    moe_layers = sum(1 for i in range(first, layers) if i % every == 0)  # vLLM's is_moe_layer
    count = moe_layers * experts * 3 * hidden * size
    how = (
        f"{moe_layers} MoE layers x {experts} routed experts x 3 (gate, up, down) x {hidden} "
        f"x {size} = {count:,} parameters"
    )
    return count, how


def _weights(
    info: dict, params: int, wbytes: float, wwhy: str, tp: int, pp: int, dp: int
) -> tuple[float, list[dict], str, int]:
    """Weights per NPU in MB, the step rows that show it, the same on one line, and the routed
    expert parameters spread over DP (0: none). With DP 1 this is params x bytes / (TP x PP)."""
    split = max(1, tp * pp)
    experts, experts_how = _routed_experts(info) if dp > 1 and params else (0, "")
    if experts >= params:  # sizes that contradict the parameter count: do not split by them
        experts = 0
    if not experts:
        mb = (params * wbytes if params else info.get("weights_bytes") or 0) / split / MB
        formula = (
            f"{params:,} parameters x {wbytes:g} B ({wwhy}) / (TP {tp} x PP {pp})"
            if params
            else f"{info.get('weights_bytes') or 0:,} B of weight files / (TP {tp} x PP {pp})"
        )
        if dp > 1:
            formula += f"; a full copy on each of the DP {dp} ranks"
            if info.get("num_experts"):
                formula += (
                    " (a MoE model whose expert sizes were not reported: every weight is "
                    "counted as split by TP x PP only, an over-estimate)"
                )
        how = (
            f"{params:,} params x {wbytes:g} B / (TP {tp} x PP {pp}) = {mb:,.0f} MB weights per NPU"
        )
        return mb, [{"what": "weights per NPU", "formula": formula, "mb": round(mb, 1)}], how, 0
    rest = params - experts
    experts_mb = experts * wbytes / (split * dp) / MB
    rest_mb = rest * wbytes / split / MB
    mb = experts_mb + rest_mb
    steps = [
        {
            "what": "routed experts per NPU",
            "formula": f"{experts_how} x {wbytes:g} B ({wwhy}) / (TP {tp} x PP {pp} x DP {dp}): "
            "vLLM spreads the expert layers over every NPU of the replica",
            "mb": round(experts_mb, 1),
        },
        {
            "what": "other weights per NPU",
            "formula": f"{params:,} - {experts:,} = {rest:,} parameters (attention, embeddings, "
            f"dense and shared-expert layers) x {wbytes:g} B / (TP {tp} x PP {pp}): a copy "
            "per DP rank",
            "mb": round(rest_mb, 1),
        },
        {
            "what": "weights per NPU",
            "formula": "routed experts + other weights",
            "mb": round(mb, 1),
        },
    ]
    how = (
        f"{experts:,} expert params x {wbytes:g} B / (TP {tp} x PP {pp} x DP {dp}) + {rest:,} "
        f"other params x {wbytes:g} B / (TP {tp} x PP {pp}) = {mb:,.0f} MB weights per NPU"
    )
    return mb, steps, how, experts


def estimate_memory(
    info: dict,
    *,
    dtype: str,
    quantization: str,
    tp: int,
    pp: int,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    hbm_total_mb: int | None,
    dp: int = 1,
) -> dict:
    """The estimate with every input and step, so the page can show how it was computed.

    Pure function of its arguments. `steps` lists (what, formula with numbers, result) rows in
    order; `how` is the same working on one line (kept for the API and the deployment page).
    `dp`: data-parallel ranks of the replica (all its hosts); the figures are per NPU, the same
    on every NPU of every member."""
    params = int(info.get("parameters") or info.get("param_count") or 0)
    wbytes, wwhy = _weight_bytes(info, dtype, quantization)
    dp = max(1, dp)
    weights_mb, weight_steps, weights_how, experts = _weights(
        info, params, wbytes, wwhy, tp, pp, dp
    )
    kv_per_token, kv_how = _kv_per_token(info, dtype, tp, pp)
    tokens = max_model_len or int(info.get("max_position_embeddings") or 0)
    kv_mb = kv_per_token * tokens / MB
    need_mb = weights_mb + kv_mb + RESERVE_MB
    have_mb = hbm_total_mb * gpu_memory_utilization if hbm_total_mb else None
    fits = have_mb is None or need_mb <= have_mb
    spare_mb = have_mb - weights_mb - RESERVE_MB if have_mb else None
    steps = [
        *weight_steps,
        {"what": "KV cache per token per NPU", "formula": kv_how, "mb": None},
        {
            "what": "KV cache for one full-length sequence",
            "formula": f"{kv_per_token:,.0f} B x {tokens:,} tokens (max model len)",
            "mb": round(kv_mb, 1),
        },
        {
            "what": "activation / workspace reserve",
            "formula": "flat, for activations, graph workspace and HCCL buffers",
            "mb": RESERVE_MB,
        },
        {
            "what": "needed per NPU",
            "formula": "weights + one sequence + reserve",
            "mb": round(need_mb, 1),
        },
    ]
    if have_mb is not None:
        steps.append(
            {
                "what": "available per NPU",
                "formula": f"{hbm_total_mb:,} MB x {gpu_memory_utilization:g} (memory utilization)",
                "mb": round(have_mb, 1),
            }
        )
    return {
        "parameters": params,
        "bytes_per_weight": wbytes,
        "weights_per_npu_mb": round(weights_mb, 1),
        "data_parallel_size": dp,
        "routed_expert_parameters": experts,
        "kv_bytes_per_token_per_npu": round(kv_per_token, 1),
        "kv_for_one_sequence_mb": round(kv_mb, 1),
        "kv_layout": "mla" if info.get("kv_lora_rank") else "mha",
        "tokens": tokens,
        "reserve_mb": RESERVE_MB,
        "need_per_npu_mb": round(need_mb, 1),
        "hbm_total_mb": hbm_total_mb,
        "gpu_memory_utilization": gpu_memory_utilization,
        "have_per_npu_mb": round(have_mb, 1) if have_mb is not None else None,
        "fits": fits,
        "headroom_mb": round(have_mb - need_mb, 1) if have_mb is not None else None,
        "max_sequences_at_full_length": (int(spare_mb // kv_mb) if have_mb and kv_mb > 0 else None),
        "kv_tokens_per_npu": (
            int(spare_mb * MB // kv_per_token) if spare_mb and kv_per_token > 0 else None
        ),
        "steps": steps,
        "how": (
            f"{weights_how}; "
            f"KV {kv_how} per token x {tokens} tokens = {kv_mb:,.0f} MB; + {RESERVE_MB} MB reserve "
            f"= {need_mb:,.0f} MB needed"
            + (
                f" vs {hbm_total_mb} MB x {gpu_memory_utilization:g} = {have_mb:,.0f} MB available"
                if have_mb
                else ""
            )
        ),
    }
