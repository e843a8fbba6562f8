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


def layer_kinds(config: dict) -> list[bool]:
    """Per decoder layer, whether it keeps a KV cache: all of them, unless config.layer_types marks
    linear ones."""
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        return ["linear" not in str(t).lower() for t in types]
    return [True] * int(config["num_hidden_layers"])


def attention_layers(config: dict) -> int:
    """Layers that keep a KV cache, in the whole model."""
    return sum(layer_kinds(config))


# The variable each engine reads for a pinned split of the layers over the stages ("a,b,...", one
# count per stage), in place of its own (stage_layers).
PP_LAYER_PARTITION = {"vllm": "VLLM_PP_LAYER_PARTITION", "sglang": "SGLANG_PP_LAYER_PARTITION"}


def stage_layers(engine: str, num_layers: int, pp_rank: int, pp_size: int, partition: str | None = None) -> range:
    """The decoder layers pipeline stage `pp_rank` of `pp_size` holds. `partition`: the engine's
    PP_LAYER_PARTITION value when the rank's environment pins one. Else as each engine splits them, an
    even share with the remainder one layer each to some stages:
    - vLLM 0.33.0, vllm/distributed/utils.py get_pp_indices: to the stages before the last one,
      counting back from the second-to-last (the last holds the final norm and the LM head);
    - SGLang 0.5.23, sglang/srt/distributed/utils.py get_pp_indices: to the last `remainder` stages."""
    if partition is not None and pp_size > 1:
        sizes = [int(n) for n in partition.split(",")]
        if len(sizes) != pp_size or sum(sizes) != num_layers:
            raise ValueError(f"{PP_LAYER_PARTITION[engine]}={partition}: {len(sizes)} stages of {sum(sizes)} layers, "
                             f"not {pp_size} of {num_layers}")
    elif engine == "vllm":
        base, extra = divmod(num_layers, pp_size)
        sizes = [base] * pp_size
        for i in range(2, extra + 2):
            sizes[-i] += 1
    elif engine == "sglang":
        base, extra = divmod(num_layers, pp_size)
        sizes = [base + (1 if i >= pp_size - extra else 0) for i in range(pp_size)]
    else:
        raise ValueError(f"no layer split known for engine {engine!r}")
    start = sum(sizes[:pp_rank])
    return range(start, start + sizes[pp_rank])


def kv_bytes_per_token(config: dict, kv_cache_dtype: str, tensor_parallel_size: int,
                       layers: int | None = None) -> float:
    """KV-cache bytes one token costs on one rank holding `layers` attention layers (every attention
    layer of the model when None: no pipeline parallelism). TP splits the KV heads (MLA's one latent
    per token is replicated on every TP rank instead); PP splits the layers, each rank caching only its
    stage's."""
    if layers is None:
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
              engine, tensor_parallel_size, pipeline_parallel_size, rank, max_model_len,
              layer_partition=None) -> tuple[int, str | None]:
    """(tokens that fit on this rank, refusal or None), for the group's TP x PP split.

    Both engines number the ranks stage by stage, one rank per node here: rank = PP stage x TP + TP
    rank (vLLM: vllm/distributed/parallel_state.py initialize_model_parallel, ranks laid out as
    (DP, PP, PCP, TP); SGLang: sglang/srt/entrypoints/engine.py _calculate_rank_ranges). So on this rank:
    - the model's weights are split over all TP x PP ranks (a stage holds 1/PP of the layers, a TP
      rank 1/TP of each layer; embedding and LM head on the first and last stage are not told apart);
    - the drafter sits whole on the last stage, split over its TP ranks (vLLM: "we put the entire draft
      model on the last PP rank", vllm/v1/worker/gpu_model_runner.py; SGLang: only the last stage runs
      the draft, sglang/srt/speculative/eagle_worker_v2.py), none on the other stages;
    - the KV cache is for this stage's attention layers only (stage_layers; layer_partition: the
      engine's pinned PP_LAYER_PARTITION, if any), at this rank's share of the heads.
    The engine sizes its cache to the smallest rank's (vLLM: vllm/v1/core/kv_cache_planning.py
    get_kv_cache_configs takes the fewest blocks of all workers), so each rank is checked."""
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    stage = rank // tp
    kinds = layer_kinds(config)
    held = stage_layers(engine, len(kinds), stage, pp, layer_partition)
    drafter_share = drafter_gib / tp if stage == pp - 1 else 0.0
    budget_gib = utilization * mem_total_gib - weights_gib / (tp * pp) - drafter_share - reserve_gib
    per_token = kv_bytes_per_token(config, kv_cache_dtype, tp, sum(kinds[i] for i in held))
    if per_token:
        tokens = max(0, int(budget_gib * GIB // per_token))
    else:  # a stage of linear-attention layers only keeps no KV cache: any length fits if the weights do
        tokens = max_model_len if budget_gib > 0 else 0
    if tokens >= max_model_len:
        return tokens, None
    split = f"{tp}" if pp == 1 else f"({tp}x{pp})"
    drafter = f"drafter {drafter_gib:.1f}/{tp} GiB" if stage == pp - 1 else "drafter 0 GiB (last stage only)"
    where = "" if pp == 1 else f" (PP stage {stage}: layers {held.start}-{held.stop - 1})"
    return tokens, (
        f"kv budget on {name}{where}: {utilization:.2f} x {mem_total_gib:.2f} GiB - weights {weights_gib:.1f}/"
        f"{split} GiB - {drafter} - reserve {reserve_gib:.1f} GiB "
        f"= {budget_gib:.2f} GiB for KV at {per_token:.0f} B/token = {tokens} tokens < max_model_len {max_model_len}"
    )


# vLLM 0.32.0 and 0.33.0 name the device: "GPU" on CUDA, else the device type upper-cased ("CPU" for
# the CPU build the lab runs), " + host" after it with hisparse (vllm/v1/core/kv_cache_utils.py,
# _kv_cache_device_name and update_kv_cache_capacity). The lab's real engine logged "CPU KV cache
# size", which a pattern for "GPU" alone let pass unverified.
_ENGINE_KV = re.compile(r"\b[A-Z]+(?: \+ host)? KV cache size:\s*([0-9,]+)\s*tokens")


def engine_kv_tokens(log: str) -> int | None:
    """The KV-cache size vLLM reports at start ("GPU KV cache size: 1,234,567 tokens", "CPU ..." on the
    CPU build), last one wins."""
    found = _ENGINE_KV.findall(log)
    return int(found[-1].replace(",", "")) if found else None
