"""Data of roles/kernel_cache: persistent JIT caches per image, warmed once, identical on every rank."""
from pydantic import BaseModel, Field, field_validator

from roles.serving.schema import refuse_empty_values

# Every JIT cache the engines write, by the variable that moves it (FACTS section 5), and its
# directory under a generation. One generation per image ID: kernels compiled by one build of
# the engine are not trusted by another.
CACHE_VARS = {
    "TILELANG_CACHE_DIR": "tilelang",
    "TRITON_CACHE_DIR": "triton",
    "VLLM_CACHE_ROOT": "vllm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
}
CONTAINER_CACHE_ROOT = "/var/cache/sparkfleet"  # where the current generation is mounted


class KernelCacheData(BaseModel):
    kernel_cache_dir: str = Field(
        "/var/lib/sparkfleet/kernel-cache",
        pattern=r"^/",
        description="per-node cache root: one generation directory per image ID, 'current' links to the served one",
    )
    kernel_cache_keep_generations: int = Field(
        2, ge=1, description="cache generations kept per node, the served one included; older ones are removed"
    )
    kernel_cache_prewarm_timeout_s: int = Field(
        3600, ge=10, description="how long a prewarm pair may take to answer /health (a cold compile is slow)"
    )
    kernel_cache_prewarm_max_rounds: int = Field(
        5, ge=2, description="warm-up rounds at most; rounds stop earlier when no rank's cache grew"
    )
    kernel_cache_prewarm_long_prompt_words: int = Field(
        4096, ge=16, description="length of the warm-up set's long-prefill prompt, in words"
    )
    kernel_cache_prewarm_env: dict[str, str] = Field(
        default_factory=lambda: {
            "VLLM_ENGINE_READY_TIMEOUT_S": "7200",
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "7200",
            "VLLM_ENGINE_ITERATION_TIMEOUT_S": "7200",
            "VLLM_RPC_TIMEOUT": "7200000",
        },
        description="environment of the prewarm pair on top of the production one: generous timeouts, so a "
        "cold compile on one rank cannot time its peer out",
    )
    _no_empty = field_validator("kernel_cache_prewarm_env")(classmethod(lambda cls, env: refuse_empty_values(env)))
