"""Data of roles/serving: which profile the pair serves, and the profile files themselves.

A profile (roles/serving/profiles/<name>.yaml) is the whole recipe card of one served system:
engine, recipe repository at a pinned commit, model at a pinned revision, parallelism,
speculative decoding, memory settings, parsers, the pinned environment and container options.
Nothing is left to an engine's or a recipe's default: a recipe update that flips a default
(the field report's CG_ESTIMATE) cannot reach the pair unseen.

Two engines read the same fields (roles/serving/engine.py renders them): vLLM and SGLang. Where
they name a setting differently the profile keeps one field and the engine maps it
(max_model_len -> SGLang --context-length, gpu_memory_utilization -> --mem-fraction-static,
max_num_batched_tokens -> --chunked-prefill-size). A field an engine cannot use is refused when
the profile loads, naming the engine, rather than silently dropped.
"""
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


def refuse_empty_values(env: dict[str, str]) -> dict[str, str]:
    """An exported empty value is read as unset or 0 (NCCL_IB_GID_INDEX= means GID index 0)."""
    empty = sorted(k for k, v in env.items() if v == "")
    if empty:
        raise ValueError(f"empty values are read as unset or 0 (NCCL_IB_GID_INDEX= means index 0): {empty}")
    return env


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Recipe(_Strict):
    repository: str = Field(description="git URL of the recipe repository")
    commit: str = Field(pattern=r"^[0-9a-f]{7,40}$", description="pinned commit (no branches, no tags)")
    dockerfile: str = Field("Dockerfile", description="the overlay image's Dockerfile, relative to the repository")
    context: str = Field(".", description="docker build context, relative to the repository")
    build_args: dict[str, str] = Field(default_factory=dict)
    launch_files: tuple[str, ...] = Field(
        ("start.sh",), description="the recipe's start script and env files, read for upstream default drift"
    )


class Speculative(_Strict):
    method: str = Field(
        description="speculative decoding method, exactly as the engine names it: vLLM's --speculative-config "
        "method (dflash2, mtp), SGLang's --speculative-algorithm (NEXTN, EAGLE, ...)"
    )
    num_speculative_tokens: int | None = Field(
        None, ge=1, description="vLLM only (required there): k, tokens drafted per step"
    )
    num_steps: int | None = Field(None, ge=1, description="SGLang only (required there): --speculative-num-steps")
    eagle_topk: int | None = Field(None, ge=1, description="SGLang only (required there): --speculative-eagle-topk")
    num_draft_tokens: int | None = Field(
        None, ge=1, description="SGLang only (required there): --speculative-num-draft-tokens"
    )
    draft_model: str | None = Field(None, description="drafter model id, when the method uses one")
    draft_model_revision: str = Field("main", min_length=1, description="the drafter's hub revision (pin a commit sha)")
    draft_tensor_parallel_size: int | None = Field(None, ge=1, description="vLLM only: the drafter's TP size")
    draft_license: str | None = Field(None, description="SPDX id of the drafter's license")


class Container(_Strict):
    network_host: bool = Field(True, description="--network host: NCCL and the rendezvous use the fabric directly")
    ipc_host: bool = Field(True, description="--ipc host: shared-memory broadcast between engine processes")
    shm_size: str = Field("64g", pattern=r"^[0-9]+[kmg]?$")
    devices: tuple[str, ...] = Field((), description="extra --device paths (/dev/infiniband is added when RDMA is on)")
    stop_timeout_s: int = Field(60, ge=1, description="docker stop grace period")


class Profile(_Strict):
    name: str
    engine: Literal["vllm", "sglang"]
    recipe: Recipe
    image: str = Field(pattern=r"^[a-z0-9][a-z0-9._/-]*$", description="image repository; the tag is the recipe commit")
    model: str
    model_revision: str = Field(min_length=1)
    served_model_name: str | None = None
    tensor_parallel_size: int = Field(ge=1)
    speculative: Speculative | None = None
    kv_cache_dtype: str
    max_model_len: int = Field(ge=1, description="context length (SGLang: --context-length)")
    gpu_memory_utilization: float = Field(
        gt=0, le=1, description="share of MemTotal the engine may take (SGLang: --mem-fraction-static, which "
        "covers weights and KV cache only, so the same number leaves less headroom there)"
    )
    max_num_batched_tokens: int = Field(ge=1, description="prefill chunk (SGLang: --chunked-prefill-size)")
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    vision: bool = Field(
        description="true: images and video served; false: the vision path is turned off (vLLM "
        "--limit-mm-per-prompt image 0 video 0, SGLang --language-model-only)"
    )
    trust_remote_code: bool = False
    env: dict[str, str] = Field(description="the pinned environment, passed to every rank")
    container: Container = Container()
    port: int = Field(8000, ge=1, le=65535, description="OpenAI-compatible API port on the head")
    master_port: int = Field(29501, ge=1, le=65535, description="rendezvous port on the head's fabric address")

    _no_empty_values = field_validator("env")(classmethod(lambda cls, env: refuse_empty_values(env)))

    @model_validator(mode="after")
    def _engine_can_use_every_field(self) -> "Profile":
        problems = ENGINE_RULES[self.engine](self)
        if problems:
            raise ValueError(f"engine {self.engine}: " + "; ".join(problems))
        return self

    @property
    def image_ref(self) -> str:
        return f"{self.image}:{self.recipe.commit}"

    @property
    def api_model_name(self) -> str:
        return self.served_model_name or self.model


# SGLang's names, from its python/sglang/srt/server_args.py (sgl-project/sglang): the builtin
# --speculative-algorithm values and the --kv-cache-dtype choices.
SGLANG_SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK")
SGLANG_KV_CACHE_DTYPES = (
    "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16", "fp4_e2m1",
)
SGLANG_ONLY_SPECULATIVE = ("num_steps", "eagle_topk", "num_draft_tokens")


def _vllm_problems(p: Profile) -> list[str]:
    problems = []
    spec = p.speculative
    if spec:
        if spec.num_speculative_tokens is None:
            problems.append("speculative.num_speculative_tokens is required (vLLM's k)")
        for key in SGLANG_ONLY_SPECULATIVE:
            if getattr(spec, key) is not None:
                problems.append(f"speculative.{key} is SGLang's; vLLM takes speculative.num_speculative_tokens")
    return problems


def _sglang_problems(p: Profile) -> list[str]:
    problems = []
    spec = p.speculative
    if spec:
        if spec.method not in SGLANG_SPECULATIVE_ALGORITHMS:
            problems.append(f"speculative.method {spec.method!r} is not an SGLang --speculative-algorithm "
                            f"(one of {', '.join(SGLANG_SPECULATIVE_ALGORITHMS)})")
        if spec.num_speculative_tokens is not None:
            problems.append("speculative.num_speculative_tokens is vLLM's; SGLang takes speculative.num_steps, "
                            "eagle_topk and num_draft_tokens")
        missing = [k for k in SGLANG_ONLY_SPECULATIVE if getattr(spec, k) is None]
        if missing:
            problems.append(f"speculative.{', speculative.'.join(missing)} required (SGLang has no default the "
                            f"pair may rely on)")
        elif spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
            problems.append(f"speculative.num_draft_tokens {spec.num_draft_tokens} with eagle_topk 1 must be "
                            f"num_steps + 1 = {spec.num_steps + 1} (SGLang silently replaces any other value)")
        if spec.draft_tensor_parallel_size is not None:
            problems.append("speculative.draft_tensor_parallel_size is vLLM's; SGLang runs the drafter at the "
                            "target's TP")
    if p.kv_cache_dtype not in SGLANG_KV_CACHE_DTYPES:
        problems.append(f"kv_cache_dtype {p.kv_cache_dtype!r} is not an SGLang --kv-cache-dtype "
                        f"(one of {', '.join(SGLANG_KV_CACHE_DTYPES)})")
    return problems


ENGINE_RULES = {"vllm": _vllm_problems, "sglang": _sglang_problems}


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str, recipe_overrides: dict | None = None) -> Profile:
    """The named profile, validated; recipe_overrides (from node data) replace recipe fields."""
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"no profile {name!r}; profiles: {', '.join(profile_names())}")
    data = yaml.safe_load(path.read_text())
    if recipe_overrides:
        data["recipe"] = {**data.get("recipe", {}), **recipe_overrides}
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        details = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"] for e in err.errors()
        )
        raise ValueError(f"profile {name!r} ({path}): {details}") from None


class ServingData(BaseModel):
    serving_profile: str = Field(
        "glm-5.3-flash-exl3", description="the profile to serve: a file name in roles/serving/profiles/"
    )
    serving_recipe_repository: str | None = Field(
        None, description="override of the profile's recipe repository (a mirror, or the lab's)"
    )
    serving_recipe_commit: str | None = Field(
        None, pattern=r"^[0-9a-f]{7,40}$", description="override of the profile's pinned recipe commit"
    )
    serving_start_at_boot: bool = Field(True, description="enable the units, so the pair starts at boot")
    serving_health_timeout_s: int = Field(
        1200, ge=10, description="how long the deploy waits for the head's /health (cold start: 6-12 min)"
    )
    serving_drop_caches: bool = Field(
        True, description="drop the page cache before start (unified memory: page cache counts as used)"
    )
    serving_prune_other_profiles: bool = Field(
        False, description="remove the images of profiles other than the served one (kept by default, for switching back)"
    )
    serving_env_pins: dict[str, str] = Field(
        default_factory=dict,
        description="environment pinned in data on top of the profile's (e.g. a recipe default that drifted)",
    )
    _no_empty_pins = field_validator("serving_env_pins")(classmethod(lambda cls, env: refuse_empty_values(env)))

    serving_ulimit_memlock: str = Field(
        "-1",
        pattern=r"^(-1|[0-9]+(:[0-9]+)?)$",
        description="--ulimit memlock of the serving containers: -1 (unlimited, RDMA registers memory); "
        "only a machine that cannot grant it (the lab) sets a number",
    )
    serving_dir: str = Field("/etc/sparkfleet", pattern=r"^/", description="where units' environment files live")


def node_profile(node) -> Profile:
    """The profile a node serves, with the node data's recipe overrides applied."""
    overrides = {}
    if node.serving_recipe_repository:
        overrides["repository"] = node.serving_recipe_repository
    if node.serving_recipe_commit:
        overrides["commit"] = node.serving_recipe_commit
    return load_profile(node.serving_profile, overrides)


SHARED_SERVING_KEYS = ("serving_profile", "serving_recipe_repository", "serving_recipe_commit")


def serving_problems(nodes) -> list[str]:
    """Cross-node serving invariants: one profile for the whole pair, loadable, sized for it."""
    problems = []
    for key in SHARED_SERVING_KEYS:
        values = {getattr(n, key) for n in nodes}
        if len(values) > 1:
            found = ", ".join(f"{n.name}={getattr(n, key)!r}" for n in nodes)
            problems.append(f"key '{key}' differs between nodes ({found}); every rank serves the same profile")
    if problems:
        return problems
    node = nodes[0]
    try:
        profile = node_profile(node)
    except ValueError as err:
        return [f"{', '.join(n.name for n in nodes)}: key 'serving_profile' = {node.serving_profile!r}: {err}"]
    if profile.tensor_parallel_size != len(nodes):
        problems.append(
            f"key 'serving_profile' = {profile.name!r}: tensor_parallel_size {profile.tensor_parallel_size} but "
            f"{len(nodes)} nodes (one GB10 GPU per node: TP must equal the node count)"
        )
    return problems
