"""KV budget: the longest context that fits on one rank, from the model's config.json and the profile.

The field report's worker had 92 GB of weights and 2.98 GB left for KV cache; its head lost ~12 GB
to other processes, so the recipe's 1M context only fit at 640K. This estimate refuses a
max_model_len that cannot fit before a cold start finds out, and the engine's own figure (from the
head's log after start) is checked against max_model_len too.
"""
import re

GIB = 1024**3

# Bytes per cached element. fp8_ds_mla is DeepSeek's packed sparse-MLA entry, per token and layer:
# 512 fp8 latent values + 4 fp32 scales + 64 bf16 rope values = 656 bytes.
DTYPE_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
FP8_DS_MLA_BYTES_PER_TOKEN_LAYER = 656


def attention_layers(config: dict) -> int:
    """Layers that keep a KV cache: all of them, unless config.layer_types marks linear ones."""
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if "linear" not in str(t).lower())
    return int(config["num_hidden_layers"])


def kv_bytes_per_token(config: dict, kv_cache_dtype: str, tensor_parallel_size: int) -> float:
    """KV-cache bytes one token costs on one rank."""
    layers = attention_layers(config)
    if "kv_lora_rank" in config:  # MLA: one latent per token, replicated on every TP rank
        if kv_cache_dtype == "fp8_ds_mla":
            return layers * FP8_DS_MLA_BYTES_PER_TOKEN_LAYER
        width = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim", 64))
        return layers * width * DTYPE_BYTES.get(kv_cache_dtype, 2)
    heads = int(config.get("num_key_value_heads", config["num_attention_heads"]))
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // int(config["num_attention_heads"]))
    heads_per_rank = max(1, heads // tensor_parallel_size)
    return layers * 2 * heads_per_rank * head_dim * DTYPE_BYTES.get(kv_cache_dtype, 2)


def kv_budget(name, *, utilization, mem_total_gib, weights_gib, drafter_gib, reserve_gib, config, kv_cache_dtype,
              tensor_parallel_size, max_model_len) -> tuple[int, str | None]:
    """(tokens that fit on this rank, refusal or None). Weights and drafter are split across TP ranks."""
    budget_gib = (
        utilization * mem_total_gib - (weights_gib + drafter_gib) / tensor_parallel_size - reserve_gib
    )
    per_token = kv_bytes_per_token(config, kv_cache_dtype, tensor_parallel_size)
    tokens = max(0, int(budget_gib * GIB // per_token))
    if tokens >= max_model_len:
        return tokens, None
    return tokens, (
        f"kv budget on {name}: {utilization:.2f} x {mem_total_gib:.2f} GiB - weights {weights_gib:.1f}/"
        f"{tensor_parallel_size} GiB - drafter {drafter_gib:.1f}/{tensor_parallel_size} GiB - reserve {reserve_gib:.1f} GiB "
        f"= {budget_gib:.2f} GiB for KV at {per_token:.0f} B/token = {tokens} tokens < max_model_len {max_model_len}"
    )


_ENGINE_KV = re.compile(r"GPU KV cache size:\s*([0-9,]+)\s*tokens")


def engine_kv_tokens(log: str) -> int | None:
    """The KV-cache size vLLM reports at start ("GPU KV cache size: 1,234,567 tokens"), last one wins."""
    found = _ENGINE_KV.findall(log)
    return int(found[-1].replace(",", "")) if found else None
