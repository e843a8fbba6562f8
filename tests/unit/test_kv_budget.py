"""KV budget guard: a context that fits passes, one that does not is refused with the numbers; per
rank for the group's TP x PP split."""
import pytest

from roles.guards.kv_budget import GIB, engine_kv_tokens, kv_budget, kv_bytes_per_token, stage_layers

# Shapes as published in the models' config.json files (abridged to the keys the estimate reads).
LLAMA_70B = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192}
# A DeepSeek-V3-shaped MLA config (61 layers, 512 latent + 64 rope). GLM-5.3-Flash's own config.json
# (hybrid: most layers linear) is read from the weights once they are on the head.
MLA = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 128}


def test_gqa_bytes_per_token_split_across_ranks():
    # 80 layers x K and V x 8 heads / TP 2 x 128 dims x 2 bytes
    assert kv_bytes_per_token(LLAMA_70B, "auto", 2) == 80 * 2 * 4 * 128 * 2


def test_mla_latent_is_replicated_and_fp8_ds_mla_is_packed():
    assert kv_bytes_per_token(MLA, "auto", 2) == 61 * (512 + 64) * 2
    assert kv_bytes_per_token(MLA, "fp8_ds_mla", 2) == 61 * 656


def test_linear_attention_layers_keep_no_kv():
    hybrid = {**MLA, "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"]}
    assert kv_bytes_per_token(hybrid, "fp8_ds_mla", 2) == 2 * 656


def budget(**overrides):
    args = dict(utilization=0.79, mem_total_gib=121.69, weights_gib=164.0, drafter_gib=4.0, reserve_gib=6.0,
                config=MLA, kv_cache_dtype="fp8_ds_mla", engine="vllm", tensor_parallel_size=2,
                pipeline_parallel_size=1, rank=1, max_model_len=640000)
    args.update(overrides)
    return kv_budget("spark-b", **args)


def test_a_context_that_fits_passes():
    # A DeepSeek-V3-shaped MLA model (61 layers) with 164 GiB of weights at 0.79: ~164K tokens fit.
    tokens, refusal = budget(max_model_len=131072)
    assert refusal is None and 131072 <= tokens < 200000


def test_all_full_attention_640k_does_not_fit_that_budget():
    tokens, refusal = budget()
    assert refusal is not None and tokens < 640000


def test_a_context_that_cannot_fit_is_refused_with_the_numbers():
    tokens, refusal = budget(max_model_len=2_000_000)
    assert refusal.startswith("kv budget on spark-b: 0.79 x 121.69 GiB - weights 164.0/2 GiB")
    assert f"= {tokens} tokens < max_model_len 2000000" in refusal


def test_weights_that_leave_no_room_give_zero_tokens():
    tokens, refusal = budget(weights_gib=190.0, utilization=0.5)
    assert tokens == 0 and refusal


def test_engine_kv_size_is_read_from_the_log():
    log = "INFO ... GPU KV cache size: 655,360 tokens\nINFO Maximum concurrency ...\n"
    assert engine_kv_tokens(log) == 655360
    assert engine_kv_tokens("nothing here") is None
    # the device as vLLM names it (vllm/v1/core/kv_cache_utils.py): the CPU build, and hisparse's host pool
    cpu = "(EngineCore pid=20) INFO 12-01 12:46:11 [kv_cache_utils.py:2327] CPU KV cache size: 131,072 tokens, Maximum"
    assert engine_kv_tokens(cpu) == 131072
    assert engine_kv_tokens("INFO GPU + host KV cache size: 2,048 tokens") == 2048


# --- Per rank for the group's TP x PP split ---------------------------------------------------

def test_pipeline_stages_split_the_layers_as_each_engine_does():
    # 61 layers over 2 stages: vLLM gives the extra layer to the stage before the last (get_pp_indices in
    # vllm/distributed/utils.py), SGLang to the last (sglang/srt/distributed/utils.py).
    assert [stage_layers("vllm", 61, s, 2) for s in (0, 1)] == [range(0, 31), range(31, 61)]
    assert [stage_layers("sglang", 61, s, 2) for s in (0, 1)] == [range(0, 30), range(30, 61)]
    # 10 layers over 4 stages: vLLM spares the first and the last, SGLang loads the last two.
    assert [len(stage_layers("vllm", 10, s, 4)) for s in range(4)] == [2, 3, 3, 2]
    assert [len(stage_layers("sglang", 10, s, 4)) for s in range(4)] == [2, 2, 3, 3]
    assert stage_layers("vllm", 80, 0, 1) == range(0, 80)
    # A partition pinned in the rank's environment wins, and must fit.
    assert stage_layers("vllm", 61, 1, 2, "20,41") == range(20, 61)
    with pytest.raises(ValueError, match="VLLM_PP_LAYER_PARTITION=20,40: 2 stages of 60 layers, not 2 of 61"):
        stage_layers("vllm", 61, 1, 2, "20,40")


def test_a_rank_caches_only_its_stages_layers():
    # PP 2 halves Llama-70B's 80 layers: each rank caches 40 of them, at TP 2's 4 of 8 KV heads.
    assert kv_bytes_per_token(LLAMA_70B, "auto", 2, layers=40) == 40 * 2 * 4 * 128 * 2
    per_rank = {rank: budget(config=LLAMA_70B, kv_cache_dtype="auto", tensor_parallel_size=2,
                             pipeline_parallel_size=2, rank=rank, weights_gib=140.0, drafter_gib=0.0,
                             max_model_len=1)[0] for rank in range(4)}
    full = budget(config=LLAMA_70B, kv_cache_dtype="auto", weights_gib=140.0, drafter_gib=0.0, max_model_len=1)[0]
    # Half the layers per rank and half the weights: more than twice the tokens of TP 2 alone.
    assert per_rank[0] == per_rank[1] == per_rank[2] == per_rank[3] > 2 * full


def test_weights_are_split_over_tp_times_pp_ranks_and_the_drafter_sits_on_the_last_stage():
    # TP 2 x PP 2 of the field report's shape: 164 GiB of weights are 41 GiB per rank, not 82; the
    # 4 GiB drafter is 2 GiB on each rank of the last stage (ranks 2, 3) and nothing on the first.
    args = dict(tensor_parallel_size=2, pipeline_parallel_size=2, max_model_len=10**9)
    first, last = budget(rank=0, **args), budget(rank=3, **args)
    stage0, stage1 = stage_layers("vllm", 61, 0, 2), stage_layers("vllm", 61, 1, 2)  # 31 and 30 layers
    assert first[0] == int((0.79 * 121.69 - 164.0 / 4 - 0 - 6.0) * GIB // (len(stage0) * 656))
    assert last[0] == int((0.79 * 121.69 - 164.0 / 4 - 4.0 / 2 - 6.0) * GIB // (len(stage1) * 656))
    assert "kv budget on spark-b (PP stage 0: layers 0-30): 0.79 x 121.69 GiB - weights 164.0/(2x2) GiB - " \
           "drafter 0 GiB (last stage only) - reserve 6.0 GiB" in first[1]
    assert "(PP stage 1: layers 31-60)" in last[1] and "drafter 4.0/2 GiB" in last[1]


def test_a_context_tp_alone_cannot_hold_fits_once_pp_splits_the_layers():
    # 640K does not fit one rank of TP 2 (above); over TP 2 x PP 2 every rank holds it.
    assert budget()[1] is not None
    for rank in range(4):
        tokens, refusal = budget(tensor_parallel_size=2, pipeline_parallel_size=2, rank=rank)
        assert refusal is None and tokens >= 640000, rank


def test_hybrid_layers_count_per_stage():
    # Stage 0 holds the two full-attention layers, stage 1 only linear ones: it keeps no KV cache.
    hybrid = {**MLA, "layer_types": ["full_attention", "full_attention", "linear_attention", "linear_attention"]}
    args = dict(config=hybrid, tensor_parallel_size=1, pipeline_parallel_size=2, max_model_len=640000)
    tokens0, _ = budget(rank=0, **args)
    assert tokens0 == int((0.79 * 121.69 - 164.0 / 2 - 0 - 6.0) * GIB // (2 * 656))
    assert budget(rank=1, **args) == (640000, None)


def test_sglang_stages_are_sglangs():
    # The same 61-layer model on SGLang: stage 0 holds 30 layers, not vLLM's 31.
    args = dict(engine="sglang", tensor_parallel_size=2, pipeline_parallel_size=2, max_model_len=10**9)
    assert "(PP stage 0: layers 0-29)" in budget(rank=1, **args)[1]
