"""Data of roles/kernel_cache: persistent JIT caches per image, warmed once, identical on every rank."""
from dataclasses import dataclass

from pydantic import BaseModel, Field

CONTAINER_CACHE_ROOT = "/var/cache/sparkfleet"  # where the current generation is mounted


@dataclass(frozen=True)
class CacheVar:
    """One JIT cache: its directory under a generation, and who moves it there with the variable."""

    subdir: str  # directory under the generation (and under CONTAINER_CACHE_ROOT in the container)
    reader: str  # the package, at the version the engine pins, that reads the variable
    source: str  # the file of that package that reads it, as read for this table
    # That file relative to site-packages, where the engine-parity virtualenvs (tests/parity) hold
    # the package and the tier can find the name in it; None where they do not (CUDA kernel
    # packages, a compiled reader, the driver): then `source` is the evidence.
    installed: str | None = None


def _site(subdir: str, reader: str, path: str) -> CacheVar:
    """A cache whose reader is a Python file the parity virtualenvs hold (checked there by name)."""
    return CacheVar(subdir, reader, path, installed=path)


# Shared by both engines' stacks (each pins the version named; the file was read at that version).
# vLLM 0.33.0 pins torch==2.14.0, SGLang 0.5.23 torch==2.14.1; both torches pin triton~=3.8.0.
_TORCH = {
    # Inductor's FX-graph and kernel caches; vLLM points it at VLLM_CACHE_ROOT while it compiles
    # (vllm/compilation/compiler_interface.py), every other torch.compile user reads this.
    "TORCHINDUCTOR_CACHE_DIR": _site("inductor", "torch 2.14.0 / 2.14.1", "torch/_inductor/runtime/cache_dir_utils.py"),
    # Compiled Triton kernels and their autotuning results (vLLM sets TRITON_CACHE_AUTOTUNING=1);
    # vLLM keeps a TRITON_CACHE_DIR set by the user (vllm/compilation/compiler_interface.py).
    "TRITON_CACHE_DIR": _site("triton", "triton 3.8.0", "triton/knobs.py"),
    # torch.utils.cpp_extension.load builds (vLLM: third_party/fmha_sm100; SGLang: its native
    # extensions through srt/utils/cpp_extension_loader.py); default <tmp>/torch_extensions.
    "TORCH_EXTENSIONS_DIR": _site("torch_extensions", "torch 2.14.0 / 2.14.1", "torch/utils/cpp_extension.py"),
}
_KERNEL_LIBRARIES = {
    # FlashInfer's JIT modules under <base>/.cache/flashinfer (and its autotune cache and the CuTe
    # DSL default of flashinfer/prims_ts/utils.py below it); default: the home directory.
    "FLASHINFER_WORKSPACE_BASE": CacheVar("flashinfer", "flashinfer-python 0.7.2.post1 (vLLM) / 0.7.2 (SGLang)",
                                          "flashinfer/jit/env.py"),
    "TILELANG_CACHE_DIR": CacheVar("tilelang", "tilelang 0.1.12", "tilelang/env.py"),
    # CuTe DSL's file cache (on by default; CUTE_DSL_DISABLE_FILE_CACHING turns it off) for the
    # CuTe DSL kernels of vLLM, SGLang and FlashInfer; default /tmp/<user>/cutlass_python_cache.
    # The 4.8.0 wheels ship this module compiled; read in the CUTLASS source FlashInfer vendors
    # (flashinfer/data/cutlass/python/CuTeDSL/...) and upstream NVIDIA/cutlass.
    "CUTE_DSL_CACHE_DIR": CacheVar("cute_dsl", "nvidia-cutlass-dsl 4.8.0",
                                   "python/CuTeDSL/cutlass/base_dsl/cache_helpers.py"),
    # tvm_ffi.cpp.load_inline builds without a build_directory (FlashInfer's
    # flashinfer/kda_kernels/ptx/static_runtime.py); default ~/.cache/tvm-ffi.
    "TVM_FFI_CACHE_DIR": _site("tvm_ffi", "apache-tvm-ffi 0.1.11", "tvm_ffi/cpp/extension.py"),
    # The driver's cache of PTX it JIT-compiled to the GPU's SASS; default ~/.nv/ComputeCache.
    "CUDA_CACHE_PATH": CacheVar("nv", "the CUDA driver",
                                "NVIDIA CUDA Programming Guide, 5.2 CUDA Environment Variables "
                                "(docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html)"),
}

# Every JIT cache each engine's stack writes, by the variable that moves it, and its directory under
# a generation. Only what that stack reads is rendered for it. One generation per engine in the image
# (roles/kernel_cache/engine_key.py: its distribution, the image's layers up to the last holding code,
# its environment): kernels compiled by one build of the engine are not trusted by another.
CACHE_VARS: dict[str, dict[str, CacheVar]] = {
    "vllm": {
        # torch.compile artifacts (torch_compile_cache/<hash>/rank_<r>/, with its inductor and
        # Triton caches), the FlashInfer autotune cache; default ~/.cache/vllm.
        "VLLM_CACHE_ROOT": _site("vllm", "vllm 0.33.0", "vllm/envs.py"),
        **_TORCH,
        **_KERNEL_LIBRARIES,
        # DeepGEMM as vLLM vendors it (vllm/third_party/deep_gemm): deep_jit's disk cache reads
        # <prefix>_JIT_CACHE_DIR with the prefix "DG" (DeepGEMM csrc/runtime/jit.hpp); default
        # $HOME/.dj. The vendored build is compiled; its _C_extension.abi3.so carries that file
        # and those names, and sgl-deep-gemm 0.2.3.post2 ships the header's source.
        "DG_JIT_CACHE_DIR": CacheVar("deep_gemm", "DeepGEMM (vendored in vllm 0.33.0)", "deep_jit/cache/disk.hpp"),
    },
    "sglang": {
        # SGLang's own root: CuTe AOT objects (SGLANG_CUTE_AOT_CACHE_DIR defaults below it), the
        # FlashInfer autotune cache, P2P checks, Rust extensions; default ~/.cache/sglang.
        "SGLANG_CACHE_DIR": _site("sglang", "sglang 0.5.23", "sglang/srt/environ.py"),
        # SGLang's JIT kernel builds; default ~/.cache/sglang/jit, NOT below SGLANG_CACHE_DIR.
        "SGLANG_JIT_CACHE_DIR": _site("sglang_jit", "sglang 0.5.23", "sglang/kernels/jit/utils/compile/cache.py"),
        # DeepGEMM (sgl-deep-gemm 0.2.3.post2): SGLang overwrites DG_JIT_CACHE_DIR with this at import
        # (srt/layers/deep_gemm_wrapper/compile_utils.py, imported by srt/model_executor/model_runner.py),
        # so DG_JIT_CACHE_DIR itself is never what SGLang's DeepGEMM reads.
        "SGLANG_DG_CACHE_DIR": _site("deep_gemm", "sglang 0.5.23", "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py"),
        **_TORCH,
        **_KERNEL_LIBRARIES,
    },
}


def cache_vars(engine: str) -> dict[str, str]:
    """{variable: directory under the generation} of every JIT cache `engine`'s stack writes."""
    return {var: c.subdir for var, c in CACHE_VARS[engine].items()}


# The prewarm pair runs production's command line and environment unchanged, plus only these, per
# engine: values that provably enter no cache key, so a kernel compiled in the prewarm is the one
# production looks up. Nothing else may differ (tests/unit/test_kernel_cache.py checks it).
PREWARM_ENV_ADDITIONS: dict[str, dict[str, str]] = {
    "vllm": {
        # The per-step RPC timeout of the mp executor (vllm/v1/executor/multiproc_executor.py), its
        # only reader: a rank compiling a kernel cold on its first request must not time its peer
        # out. In the ignore list of vllm/envs.py compile_factors(), the env hash vLLM keys its
        # torch.compile cache with; no other package of the stack names it. (Not so
        # VLLM_ENGINE_READY_TIMEOUT_S: it is hashed, so the prewarm keeps production's.)
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "7200",
    },
    "sglang": {},
}


# The lines of each engine's log that say what its compile cache did, printed from every prewarm rank
# before its container goes (`docker logs`), so the deploy's output names the cache directory the
# prewarm wrote and what compiling cost; production's journal has the same lines to compare (tests/real).
# vLLM 0.32.0 and 0.33.0: vllm/compilation/backends.py ("Using cache directory: ... for vLLM's
# torch.compile", "Directly load the compiled graph(s) ... from the cache", "Compiling a graph for
# compile range ... takes"), vllm/compilation/monitor.py ("torch.compile took ... in total"),
# vllm/v1/worker/cpu_model_runner.py (on CPU: "Warming up model for the compilation", "Warming up
# done"), vllm/v1/engine/core.py ("init engine (profile, create kv cache, warmup model) took"). SGLang: none.
COMPILE_LOG_LINES: dict[str, str | None] = {
    "vllm": r"Using cache directory: |Directly load the compiled graph|Compiling a graph for compile range|"
            r"torch\.compile took|Warming up model for the compilation|Warming up done|init engine \(profile",
    "sglang": None,
}


def prewarm_env(engine: str, production_env: dict[str, str]) -> dict[str, str]:
    """The prewarm environment of a rank: its production environment plus PREWARM_ENV_ADDITIONS."""
    return {**production_env, **PREWARM_ENV_ADDITIONS[engine]}


class KernelCacheData(BaseModel):
    kernel_cache_dir: str = Field(
        "/var/lib/sparkfleet/kernel-cache",
        pattern=r"^/",
        description=("per-node JIT cache root: one generation per engine in the image (read from its layers; per "
                     "image ID where it cannot be) and compile key, `current` links to the served one"),
    )
    kernel_cache_keep_generations: int = Field(
        2, ge=1, description="cache generations kept per node (the served one included); older ones are removed"
    )
    kernel_cache_prewarm_timeout_s: int = Field(
        3600, ge=10, description="how long the prewarm pair may take to answer `/health` (a cold compile is slow)"
    )
    kernel_cache_prewarm_max_rounds: int = Field(
        5, ge=2, description="warm-up rounds at most; they stop as soon as no rank's cache grew in a round"
    )
    kernel_cache_prewarm_long_prompt_words: int = Field(
        4096, ge=16, description="length of the warm-up set's long-prefill prompt, in words"
    )
