"""Who reads each environment variable a rank's env file carries, other than the engine itself.

Every variable in a rank's environment is one of three things, and the engine-parity tier
(tests/parity) fails on anything else:
1. read by the engine at the pinned version: vLLM's own set is vllm/envs.py's
   `environment_variables`, SGLang's is the one tests/parity/check_sglang.py derives; both are
   asked of the real engine, not written here;
2. read by a library the engine uses: this table, each with the upstream file that reads it and,
   where the parity virtualenv holds that library, the installed file the tier finds the name in;
3. read by the recipe's launcher: declared per profile (`launcher_env`).
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Reader:
    library: str
    source: str  # the upstream file that reads the variable
    # The file (relative to site-packages of the engine's parity virtualenv) in which the tier finds
    # the variable's name; None for a library that virtualenv does not hold (NCCL, a C library
    # shipped with the CUDA build): then the source above is the evidence.
    installed: str | None = None
    engines: tuple[str, ...] = ("vllm", "sglang")


# NCCL declares each of these with NCCL_PARAM (name without the NCCL_ prefix, joined at run time,
# so the full name is not a string in libnccl.so) and documents it in its User Guide.
_NCCL = Reader("NCCL", "NVIDIA/nccl src/include/param.h (NCCL_PARAM); NCCL User Guide, Environment Variables")

LIBRARY_ENV: dict[str, Reader] = {
    # The fabric: NCCL's sockets and RoCE on the CX7 netdev (FACTS section 2).
    **dict.fromkeys(
        ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY",
         "NCCL_IB_ROCE_VERSION_NUM", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"),
        _NCCL,
    ),
    # torch's gloo process groups (the CPU-side groups both engines create) on the fabric netdev.
    "GLOO_SOCKET_IFNAME": Reader(
        "torch (gloo)", "pytorch/pytorch torch/csrc/distributed/c10d/ProcessGroupGloo.cpp", "torch/lib/libtorch_cpu.so"
    ),
    "PYTORCH_CUDA_ALLOC_CONF": Reader(
        "torch (caching allocator)", "pytorch/pytorch c10/core/AllocatorConfig.cpp", "torch/lib/libc10.so"
    ),
    "HF_HUB_OFFLINE": Reader(
        "huggingface_hub", "huggingface/huggingface_hub src/huggingface_hub/constants.py", "huggingface_hub/constants.py"
    ),
}


def library_readers(engine: str) -> dict[str, Reader]:
    """Every variable a library of `engine`'s stack reads, the kernel caches' movers included."""
    from roles.kernel_cache.schema import cache_readers

    table = {**LIBRARY_ENV, **cache_readers(engine)}
    return {name: r for name, r in table.items() if engine in r.engines}
