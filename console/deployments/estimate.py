"""How much NPU memory a replica needs, and how that was computed (shown to the user).

weights per NPU    = parameters x bytes per weight / (TP x PP)
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
) -> dict:
    """The estimate with every input and step, so the page can show how it was computed.

    Pure function of its arguments. `steps` lists (what, formula with numbers, result) rows in
    order; `how` is the same working on one line (kept for the API and the deployment page)."""
    split = max(1, tp * pp)
    params = int(info.get("parameters") or info.get("param_count") or 0)
    wbytes, wwhy = _weight_bytes(info, dtype, quantization)
    weights_mb = (
        params * wbytes / split / MB if params else (info.get("weights_bytes") or 0) / split / MB
    )
    kv_per_token, kv_how = _kv_per_token(info, dtype, tp, pp)
    tokens = max_model_len or int(info.get("max_position_embeddings") or 0)
    kv_mb = kv_per_token * tokens / MB
    need_mb = weights_mb + kv_mb + RESERVE_MB
    have_mb = hbm_total_mb * gpu_memory_utilization if hbm_total_mb else None
    fits = have_mb is None or need_mb <= have_mb
    spare_mb = have_mb - weights_mb - RESERVE_MB if have_mb else None
    steps = [
        {
            "what": "weights per NPU",
            "formula": f"{params:,} parameters x {wbytes:g} B ({wwhy}) / (TP {tp} x PP {pp})"
            if params
            else f"{info.get('weights_bytes') or 0:,} B of weight files / (TP {tp} x PP {pp})",
            "mb": round(weights_mb, 1),
        },
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
            f"{params:,} params x {wbytes:g} B / (TP {tp} x PP {pp}) = {weights_mb:,.0f} MB weights per NPU; "
            f"KV {kv_how} per token x {tokens} tokens = {kv_mb:,.0f} MB; + {RESERVE_MB} MB reserve "
            f"= {need_mb:,.0f} MB needed"
            + (
                f" vs {hbm_total_mb} MB x {gpu_memory_utilization:g} = {have_mb:,.0f} MB available"
                if have_mb
                else ""
            )
        ),
    }
