"""How much NPU memory a replica needs, and how that was computed (shown to the user).

weights per NPU   = parameters x bytes per weight / (TP x PP)
KV cache per token = 2 (K and V) x layers x KV heads x head dim x bytes per element / (TP x PP)
need per NPU      = weights per NPU + KV for one full-length sequence (max_model_len tokens)
                    + a fixed activation / workspace reserve
have per NPU      = HBM total x gpu_memory_utilization
A replica fits when need <= have; what is left of `have` becomes more KV cache (more sequences).
"""

from __future__ import annotations

BYTES_PER_DTYPE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}
# msModelSlim W8A8 ("ascend") and the usual 8-bit formats store ~1 byte per weight; 4-bit ~0.5.
BYTES_PER_QUANT = {"ascend": 1.0, "fp8": 1.0, "gptq": 0.5, "awq": 0.5, "compressed-tensors": 1.0}
RESERVE_MB = 1024  # activations, graph workspace, HCCL buffers: a conservative flat reserve
MB = 1024 * 1024


def _weight_bytes(info: dict, dtype: str, quantization: str) -> float:
    if quantization in BYTES_PER_QUANT:
        return BYTES_PER_QUANT[quantization]
    if dtype == "auto":
        dtype = str(info.get("torch_dtype") or "bfloat16")
    return BYTES_PER_DTYPE.get(dtype, 2)


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
    """The estimate with every input and step, so the page can show how it was computed."""
    split = max(1, tp * pp)
    params = int(info.get("parameters") or info.get("param_count") or 0)
    wbytes = _weight_bytes(info, dtype, quantization)
    weights_mb = (
        params * wbytes / split / MB if params else (info.get("weights_bytes") or 0) / split / MB
    )
    heads = int(info.get("num_attention_heads") or 1)
    kv_heads = int(info.get("num_key_value_heads") or heads)
    head_dim = int(info.get("head_dim") or (int(info.get("hidden_size") or 0) // max(1, heads)))
    layers = int(info.get("num_hidden_layers") or 0)
    kv_elem = BYTES_PER_DTYPE.get(
        dtype if dtype != "auto" else str(info.get("torch_dtype") or "bfloat16"), 2
    )
    kv_per_token = 2 * layers * kv_heads * head_dim * kv_elem / split
    tokens = max_model_len or int(info.get("max_position_embeddings") or 0)
    kv_mb = kv_per_token * tokens / MB
    need_mb = weights_mb + kv_mb + RESERVE_MB
    have_mb = hbm_total_mb * gpu_memory_utilization if hbm_total_mb else None
    return {
        "parameters": params,
        "bytes_per_weight": wbytes,
        "weights_per_npu_mb": round(weights_mb, 1),
        "kv_bytes_per_token_per_npu": round(kv_per_token, 1),
        "kv_for_one_sequence_mb": round(kv_mb, 1),
        "tokens": tokens,
        "reserve_mb": RESERVE_MB,
        "need_per_npu_mb": round(need_mb, 1),
        "hbm_total_mb": hbm_total_mb,
        "gpu_memory_utilization": gpu_memory_utilization,
        "have_per_npu_mb": round(have_mb, 1) if have_mb is not None else None,
        "fits": have_mb is None or need_mb <= have_mb,
        "max_sequences_at_full_length": (
            int((have_mb - weights_mb - RESERVE_MB) // kv_mb) if have_mb and kv_mb > 0 else None
        ),
        "how": (
            f"{params:,} params x {wbytes:g} B / (TP {tp} x PP {pp}) = {weights_mb:,.0f} MB weights per NPU; "
            f"KV 2 x {layers} layers x {kv_heads} KV heads x {head_dim} dim x {kv_elem} B / {split} "
            f"= {kv_per_token:,.0f} B/token x {tokens} tokens = {kv_mb:,.0f} MB; + {RESERVE_MB} MB reserve "
            f"= {need_mb:,.0f} MB needed"
            + (
                f" vs {hbm_total_mb} MB x {gpu_memory_utilization:g} = {have_mb:,.0f} MB available"
                if have_mb
                else ""
            )
        ),
    }
