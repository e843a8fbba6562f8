"""KV budget guard: a context that fits passes, one that does not is refused with the numbers."""

from roles.guards.kv_budget import engine_kv_tokens, kv_budget, kv_bytes_per_token

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
                config=MLA, kv_cache_dtype="fp8_ds_mla", tensor_parallel_size=2, max_model_len=640000)
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
