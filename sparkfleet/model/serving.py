"""Data of roles/serving: which profile the pair serves, and the profile files themselves.

A profile (roles/serving/profiles/<name>.yaml) is the whole recipe card of one served system:
engine, recipe repository at a pinned commit, model at a pinned revision, parallelism,
speculative decoding, memory settings, parsers, the pinned environment and container options.
Nothing is left to an engine's or a recipe's default: a recipe update that flips a default
(the field report's CG_ESTIMATE) cannot reach the pair unseen.

Two engines read the same fields (sparkfleet/model/engine.py renders them): vLLM and SGLang. Where
they name a setting differently the profile keeps one field and the engine maps it
(max_model_len -> SGLang --context-length, gpu_memory_utilization -> --mem-fraction-static,
max_num_batched_tokens -> --chunked-prefill-size). A field an engine cannot use is refused when
the profile loads, naming the engine, rather than silently dropped.
"""
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkfleet import grammar
from sparkfleet.grammar import field_check
from sparkfleet.model import profile_file
from sparkfleet.model.engine_advisories import ADVISORY_IDS
from sparkfleet.model.env_readers import release, unread_engine_vars
from sparkfleet import values

# The profiles are the serving role's data files (roles/serving/profiles/): read here by path.
PROFILES_DIR = Path(__file__).resolve().parents[2] / "roles" / "serving" / "profiles"
# A commit that cannot move: recipe commits and, with trust_remote_code, hub revisions.
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
# Run by an RDMA rank's unit before every start: the RoCE v2 GID index read again (sfl_gid.sh here).
SFL_GID = "/usr/local/libexec/sparkfleet/sfl_gid.sh"


_EXTRA_FLAG = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_-]*(=.*)?$")


# Every engine flag whose value is a secret, at the pinned versions, and where sparkfleet takes that
# secret instead: on a command line it is in every user's `ps`, /proc/<pid>/cmdline, the unit file
# and `docker inspect`. Read from the engines' own parsers (the parity tier fails when a flag whose
# name ends in key/token or carries secret/password is added upstream and not listed here):
# - vLLM 0.33.0: --api-key (vllm/entrypoints/common/cli_args.py), --hf-token (vllm/engine/arg_utils.py);
# - SGLang 0.5.23: --api-key, --admin-api-key, --ssl-keyfile-password (sglang/srt/arg_groups/fields/serving.py).
SECRET_FLAGS = {
    "--api-key": "the engine gets no API key: the API proxy checks the one in the root-only serving_api_key_file "
                 "(default <serving_dir>/api-key)",
    "--hf-token": "the hub token is read from the root-only weights_hf_token_file (default /etc/sparkfleet/hf-token)",
    "--admin-api-key": "sparkfleet serves no admin endpoint key; the API proxy checks the key in serving_api_key_file",
    "--ssl-keyfile-password": "sparkfleet renders no TLS key on the engine; a secret never goes on a command line",
}
# Variables whose value is a secret, and where sparkfleet takes it instead: in data a secret sits in
# the inventory (and its repository) and in every rank's env file. vLLM 0.33.0 reads VLLM_API_KEY
# (vllm/envs.py); huggingface_hub, in both engines' images, HF_TOKEN then HUGGING_FACE_HUB_TOKEN
# (huggingface_hub/utils/_auth.py, _get_token_from_environment).
SECRET_VARS = {
    "VLLM_API_KEY": SECRET_FLAGS["--api-key"],
    "HF_TOKEN": SECRET_FLAGS["--hf-token"],
    "HUGGING_FACE_HUB_TOKEN": SECRET_FLAGS["--hf-token"],
}
# Engine flags that are a proper prefix of a secret flag (argparse takes an unambiguous prefix as the
# flag: `--api-ke X` is --api-key X) but name another flag exactly: SGLang's --ssl-keyfile (a path).
NOT_SECRET_PREFIXES = ("--ssl-keyfile",)


def secret_flag(word: str) -> str | None:
    """The secret flag `word` sets (itself, its --x_y spelling, its =value form, or an abbreviation
    argparse expands to it), or None."""
    if not word.startswith("--"):
        return None
    name = word.split("=", 1)[0].replace("_", "-")  # vLLM's parser takes --api_key as --api-key
    if name in NOT_SECRET_PREFIXES:
        return None
    return next((flag for flag in SECRET_FLAGS if flag.startswith(name)), None)


# Node data whose refusal would print a secret flag's value (withhold_secrets shows it as ***).
SECRET_BEARING_KEYS = ("serving_extra_args",)


def withhold_secrets(args):
    """`args` as a refusal may print them: the value of every secret flag replaced by '***'."""
    if not isinstance(args, (list, tuple)):
        return args
    out, hide = [], False
    for word in args:
        flag = secret_flag(word) if isinstance(word, str) else None
        if flag and "=" in word:
            out.append(word.split("=", 1)[0] + "=***")
        else:
            out.append("***" if hide and isinstance(word, str) and not word.startswith("--") else word)
        hide = bool(flag) and "=" not in word
    return out


def check_extra_args(args):
    """Engine flags with their values: the first word a flag, every --word a well-formed flag, no
    flag that carries a secret."""
    if args and not args[0].startswith("--"):
        raise ValueError(f"must start with a flag (--name), got {args[0]!r}")
    bad = [w for w in args if w.startswith("--") and not _EXTRA_FLAG.match(w)]
    if bad:
        raise ValueError(f"not a flag: {bad}")
    for word in args:
        flag = secret_flag(word)
        if flag:
            shown = word.split("=", 1)[0]
            named = flag if shown == flag else f"{shown} (the engine reads it as {flag})"
            raise ValueError(f"{named} puts a secret on the engine's command line (every user's ps, the unit file, "
                             f"docker inspect): {SECRET_FLAGS[flag]}")
    return args


_DOMAIN = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")

# Rendered when no media domain is allowed: both engines read an empty allowlist as "any domain"
# (vllm/multimodal/media/connector.py, sglang/srt/utils/common.py _assert_media_url_allowed), so the
# list names one that cannot resolve (RFC 6761 reserves .invalid): only inline data: URLs remain.
NO_MEDIA_DOMAIN = "media.invalid"


def check_media_domains(domains):
    """Hostnames only: no scheme, port, path, wildcard or space."""
    bad = [d for d in domains if not isinstance(d, str) or not _DOMAIN.match(d)]
    if bad:
        raise ValueError(f"not a hostname (letters, digits, '-' and '.', no scheme, port or path): {bad}")
    return domains


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def refuse_empty_values(env: dict[str, str]) -> dict[str, str]:
    """An exported empty value is read as unset or 0 (NCCL_IB_GID_INDEX= means GID index 0); a name
    that is not a variable name, or a value with a newline or another control character, would
    break the env file (one line per variable) it is written to."""
    empty = sorted(k for k, v in env.items() if v == "")
    if empty:
        raise ValueError(f"empty values are read as unset or 0 (NCCL_IB_GID_INDEX= means index 0): {empty}")
    names = sorted(k for k in env if not _ENV_NAME.fullmatch(k))
    if names:
        raise ValueError(f"not variable names (letters, digits, _; not starting with a digit): {names}")
    control = sorted(k for k, v in env.items() if any(ord(c) < 32 or ord(c) == 127 for c in v))
    if control:
        raise ValueError(f"values with a newline or another control character (an env file holds one line per "
                         f"variable): {control}")
    return env


class _Strict(BaseModel):
    # strict: '640000' or 'true' in a profile is refused, not converted (tuple fields take YAML lists)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Recipe(_Strict):
    repository: str = Field(description="git URL of the recipe repository")
    commit: str = Field(
        pattern=r"^[0-9a-f]{7,40}$", description="pinned commit, the full 40-hex SHA (no branches, no tags; an "
        "abbreviated one is refused at prepare, naming the full SHA where the head can resolve it)"
    )
    dockerfile: str = Field("Dockerfile", description="the overlay image's Dockerfile, relative to the repository")
    context: str = Field(".", description="docker build context, relative to the repository")
    build_args: dict[str, str] = Field(default_factory=dict)
    launch_files: tuple[str, ...] = Field(
        ("start.sh",), strict=False, description="the recipe's start script and env files, read for upstream default drift"
    )
    launcher: str | None = Field(
        None, min_length=1, description="the recipe's launcher, run at a bump in the new image with the engine "
        "replaced by a recorder (exact drift): a path in the image (/opt/recipe/start.sh) or relative to the "
        "repository (start.sh); none: exact drift is not checked"
    )
    launcher_args: Literal["engine", "flags", "none"] = Field(
        "engine", description="what the launcher is given: engine, sparkfleet's arguments after the engine command "
        "(`exec vllm serve \"$@\"`); flags, the same without the model argument; none, nothing (a launcher that "
        "builds the engine's command line from its environment)"
    )

    # Each reaches git, docker build or a path on the head (sparkfleet/grammar.py).
    _repository = field_validator("repository")(field_check(grammar.git_repository_problem))
    _in_repository = field_validator("dockerfile", "context", "launch_files")(field_check(grammar.relative_path_problem))
    _launcher = field_validator("launcher")(field_check(
        lambda v: grammar.absolute_path_problem(v) if v.startswith("/") else grammar.relative_path_problem(v)))
    _build_args = field_validator("build_args")(field_check(
        lambda args: next((f"{k!r} is not a variable name" for k in args if not grammar.ENV_NAME.fullmatch(k)), None)
        or next((f"{k}: {why}" for k, v in args.items() for why in [values.control_problem(v)] if why), None)))


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
    draft_model: str | None = Field(None, description="drafter model id (`owner/name`), when the method uses one")
    draft_model_revision: str = Field("main", description="the drafter's hub revision (pin a commit sha; a branch or "
                                      "tag name as git check-ref-format allows)")
    draft_tensor_parallel_size: int | None = Field(None, ge=1, description="vLLM only: the drafter's TP size")
    draft_license: str | None = Field(None, description="SPDX id of the drafter's license")
    draft_kv_cache_dtype: str | None = Field(
        None, description="vLLM only: the drafter's KV-cache dtype (speculative config kv_cache_dtype); unset, "
        "the drafter inherits the target's (vllm/config/speculative.py)"
    )

    # The drafter's id is a directory (`<weights_dir>/<id>`) and a hub argument, its revision a manifest line.
    _draft_model = field_validator("draft_model")(field_check(grammar.hub_repo_id_problem))
    _draft_revision = field_validator("draft_model_revision")(field_check(grammar.revision_problem))
    _tokens = field_validator("method", "draft_kv_cache_dtype")(field_check(grammar.token_problem))
    _license = field_validator("draft_license")(field_check(grammar.spdx_problem))


class Extension(_Strict):
    """Something the recipe's overlay image adds to the engine, which upstream does not have.

    The engine-parity tier (tests/parity) feeds every rendered command line to the upstream engine
    at the pinned version: a refusal there fails the tier unless a declared extension owns exactly
    that flag and value, and a declared extension the upstream engine accepts anyway fails it too.
    """
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    what: str = Field(min_length=1, description="what the recipe adds, in a sentence")
    flag: str = Field(pattern=r"^--[a-z0-9-]+$", description="the engine flag whose value depends on it")
    value: str | None = Field(None, description="the value (or, for a JSON flag, the 'key=value' part) it makes valid")
    recipe_file: str = Field(min_length=1, description="the file in the recipe repository that adds it")


# The capabilities a profile may give its engine back (container.cap_add): Docker's default set
# (moby/moby oci/caps/defaults.go), which the engine had before sparkfleet dropped them all, and
# SYS_NICE, which both engines name for NUMA memory binding. None is needed by vLLM or SGLang
# themselves (sparkfleet/model/engine.py ENGINE_SECURITY_ARGS says why); one is for a recipe image
# whose own entrypoint does what it guards. Anything broader (SYS_ADMIN, SYS_PTRACE, NET_ADMIN, ...)
# is refused: no engine needs it.
ENGINE_CAPABILITIES = ("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                       "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT", "SYS_NICE")


class Container(_Strict):
    network_host: bool = Field(True, description="--network host: NCCL and the rendezvous use the fabric directly")
    ipc_host: bool = Field(True, description="--ipc host: shared-memory broadcast between engine processes")
    shm_size: str = Field("64g", pattern=r"^[0-9]+[kmg]?$")
    devices: tuple[str, ...] = Field((), strict=False, description="extra --device paths (/dev/infiniband is added when RDMA is on)")
    _devices = field_validator("devices")(field_check(grammar.absolute_path_problem))
    stop_timeout_s: int = Field(60, ge=1, description="docker stop grace period")
    cap_add: tuple[Literal[ENGINE_CAPABILITIES], ...] = Field(
        (), strict=False, description="capabilities given back to the engine's container, which runs with every "
        "other dropped (--cap-drop=ALL, no-new-privileges): none for vLLM or SGLang themselves; one of Docker's "
        "default set, or SYS_NICE, only for a recipe image whose own entrypoint needs it (docs/security.md)")


class Profile(_Strict):
    name: str
    engine: Literal["vllm", "sglang"]
    engine_version: str | None = Field(
        description="the engine release the recipe's image ships, as the image's engine package names itself "
        "(a PEP 440 version; a local part such as +cpu is allowed), with the recipe file that pins it cited "
        "beside it; null (written out) when no source establishes it. The check before any connection holds "
        "the profile's VLLM_*/SGLANG_* pins to that release's snapshot (sparkfleet/model/env_readers.py "
        "SNAPSHOT_VERSIONS); a version without one is not refused there, the plan says so and the engine in "
        "the built image judges them. The image's own metadata overrides this once the image exists"
    )
    recipe: Recipe
    image: str = Field(description="image repository (a Docker image name, no registry and no tag: "
                       "distribution/reference's path components); the tag is the recipe commit")
    model: str = Field(description="the model's hub repository id, `owner/name` (huggingface_hub's validate_repo_id)")
    model_revision: str = Field(description="the model's hub revision: a 40-hex commit (pin one), or a branch or tag "
                                "name (git check-ref-format's rules)")
    served_model_name: str | None = Field(None, description="the name the API serves the model under: a plain token "
                                          "(letters, digits, _ . : -); none: the hub id")
    tensor_parallel_size: int = Field(
        ge=1, description="TP: each layer's heads and weights split across this many ranks (vLLM "
        "--tensor-parallel-size, SGLang --tp-size)"
    )
    pipeline_parallel_size: int = Field(
        ge=1, description="PP: the layers split into this many consecutive stages, each on TP ranks (vLLM "
        "--pipeline-parallel-size, SGLang --pp-size; always rendered, 1 included). One GB10 per node: "
        "tensor_parallel_size x pipeline_parallel_size is the serving group's node count"
    )
    speculative: Speculative | None = None
    kv_cache_dtype: str
    quantization: str | None = Field(
        None, description="the engine's --quantization, explicit rather than detected from the checkpoint "
        "(the recipe's launcher passes it)"
    )
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
    distributed_timeout_s: int = Field(
        ge=60, description="torch.distributed timeout of the engine's process groups: vLLM "
        "--distributed-timeout-seconds (vllm/config/parallel.py), SGLang --dist-timeout "
        "(python/sglang/srt/server_args.py). A collective that makes no progress this long ends the "
        "process instead of hanging the pair"
    )
    watchdog_timeout_s: int | None = Field(
        None, ge=60, description="SGLang only (required there): --watchdog-timeout, how long a scheduler "
        "step may take before SGLang's watchdog kills the server"
    )
    env: dict[str, str] = Field(
        description="the pinned environment, passed to every rank: each variable is read by the engine or "
        "by a library it uses (sparkfleet/model/env_readers.py; the parity tier proves it)"
    )
    launcher_env: dict[str, str] = Field(
        default_factory=dict,
        description="variables read by the recipe's launcher (its start script), not by the engine: "
        "pinned so that a recipe default that flips cannot reach the pair, passed to every rank",
    )
    extensions: tuple[Extension, ...] = Field(
        (), strict=False, description="what the recipe's overlay adds to the engine; the parity tier accepts exactly these"
    )
    container: Container = Container()
    port: int = Field(8000, ge=1, le=65535, description="OpenAI-compatible API port on the head")
    master_port: int = Field(29501, ge=1024, le=65535, description="rendezvous port on the head's fabric address "
                             "(>= 1024: the engine that binds it has no CAP_NET_BIND_SERVICE)")

    extra_args: tuple[str, ...] = Field(
        (), strict=False, description="engine flags with their values that no field renders (a flag the recipe's launcher "
        "passes, adopted), appended after sparkfleet's on every rank; a flag sparkfleet renders is refused"
    )

    _no_empty_values = field_validator("env", "launcher_env")(classmethod(lambda cls, env: refuse_empty_values(env)))
    # Names held to what they name (sparkfleet/grammar.py): the profile's name is a directory of receipts
    # and a file of recipe history; the image a registry path and a unit's word; the model id a directory
    # and a hub argument, its revision a manifest line; the served name what clients send; the engine's
    # choices words of its command line.
    _name = field_validator("name")(field_check(grammar.token_problem))
    _image = field_validator("image")(field_check(grammar.image_path_problem))
    _model = field_validator("model")(field_check(grammar.hub_repo_id_problem))
    _revision = field_validator("model_revision")(field_check(grammar.revision_problem))
    _served = field_validator("served_model_name")(field_check(grammar.served_name_problem))
    _choices = field_validator("kv_cache_dtype", "quantization", "tool_call_parser", "reasoning_parser")(
        field_check(grammar.token_problem))
    _extra_args = field_validator("extra_args")(classmethod(lambda cls, args: check_extra_args(args)))
    # A version the engine's own packaging could write (release() refuses anything else, naming it).
    _engine_version = field_validator("engine_version")(
        classmethod(lambda cls, v: v if v is None or release(v) else v))

    @model_validator(mode="after")
    def _launcher_env_apart(self) -> "Profile":
        both = sorted(set(self.env) & set(self.launcher_env))
        if both:
            raise ValueError(f"{', '.join(both)} in both env and launcher_env: a variable is the engine's or the "
                             f"launcher's")
        return self

    @model_validator(mode="after")
    def _remote_code_only_at_a_pinned_revision(self) -> "Profile":
        # trust_remote_code runs Python from the checkpoint: only from a revision that cannot move.
        if not self.trust_remote_code:
            return self
        revisions = [("model_revision", self.model_revision)]
        if self.speculative and self.speculative.draft_model:
            revisions.append(("speculative.draft_model_revision", self.speculative.draft_model_revision))
        loose = [f"{key} {value!r}" for key, value in revisions if not FULL_SHA.match(value)]
        if loose:
            raise ValueError(
                f"trust_remote_code runs the checkpoint's own code, so every revision must be a full 40-hex commit "
                f"SHA, not a branch or tag: {', '.join(loose)} (the hub shows the SHA of a revision under "
                f"'Files and versions' > history)"
            )
        return self

    @model_validator(mode="after")
    def _engine_reads_every_pinned_variable(self) -> "Profile":
        secrets = sorted(set(self.env) & set(SECRET_VARS))
        if secrets:
            raise ValueError(f"env: {', '.join(secrets)} is a secret: {SECRET_VARS[secrets[0]]}")
        unread = unread_engine_vars(self.engine, self.env, self.engine_version)
        if unread:
            raise ValueError(f"env: {'; '.join(unread)} (a variable the recipe's launcher reads belongs in launcher_env)")
        return self

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
# As read in sglang 0.5.23 (the version the parity tier proves against): the algorithms of
# srt/speculative/spec_registry.py, NEXTN being its alias of EAGLE, and --kv-cache-dtype's choices.
SGLANG_SPECULATIVE_ALGORITHMS = (
    "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK", "UNO", "FROZEN_KV_MTP",
)
SGLANG_KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
SGLANG_ONLY_SPECULATIVE = ("num_steps", "eagle_topk", "num_draft_tokens")
# Pipeline parallelism across nodes, read in the engines at the pinned versions. Both run it with
# the multi-node launch sparkfleet renders, so neither refuses pipeline_parallel_size > 1 as such:
# - vLLM 0.33.0: --pipeline-parallel-size (vllm/engine/arg_utils.py); the mp executor spans nodes with
#   --nnodes/--node-rank, world size TP x PP, rank = PP stage x TP + TP rank, one rank per node here,
#   the output read from the first rank of the last stage (vllm/v1/executor/multiproc_executor.py
#   _init_executor, _get_output_rank); --nnodes must divide TP x PP (create_engine_config).
# - SGLang 0.5.23: --pp-size (sglang/srt/arg_groups/fields/parallel.py); every node gets its PP and
#   TP ranks from --nnodes/--node-rank (sglang/srt/entrypoints/engine.py _calculate_rank_ranges:
#   with one GPU per node, stage node_rank // TP and TP rank node_rank % TP, the same order as
#   vLLM's); tp_size x pp_size must be a multiple of nnodes (check_server_args in
#   sglang/srt/arg_groups/validation_hook.py). Its check_pipeline_parallel_compat (same file) allows
#   speculative decoding with PP only for EAGLE (NEXTN is its alias, resolved to EAGLE in
#   sglang/srt/arg_groups/speculative_hook.py); DSPARK only with prefill disaggregation, which
#   sparkfleet does not render. That check runs after the checkpoint's config is read, so the parity
#   tier cannot reach it without weights: it is refused here when the profile loads.
SGLANG_PP_SPECULATIVE_ALGORITHMS = ("EAGLE", "NEXTN")


def _vllm_problems(p: Profile) -> list[str]:
    problems = []
    spec = p.speculative
    if spec:
        if spec.num_speculative_tokens is None:
            problems.append("speculative.num_speculative_tokens is required (vLLM's k)")
        for key in SGLANG_ONLY_SPECULATIVE:
            if getattr(spec, key) is not None:
                problems.append(f"speculative.{key} is SGLang's; vLLM takes speculative.num_speculative_tokens")
    if p.watchdog_timeout_s is not None:
        problems.append(f"watchdog_timeout_s {p.watchdog_timeout_s} is SGLang's (--watchdog-timeout); vLLM's "
                        f"per-step bound is VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS in env")
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
        if spec.draft_kv_cache_dtype is not None:
            problems.append("speculative.draft_kv_cache_dtype is vLLM's; SGLang's drafter uses --kv-cache-dtype")
        if p.pipeline_parallel_size > 1 and spec.method not in SGLANG_PP_SPECULATIVE_ALGORITHMS:
            problems.append(f"speculative.method {spec.method!r} with pipeline_parallel_size "
                            f"{p.pipeline_parallel_size}: SGLang runs pipeline parallelism with EAGLE (NEXTN) "
                            f"drafting only and refuses any other at start (check_pipeline_parallel_compat)")
    if p.watchdog_timeout_s is None:
        problems.append("watchdog_timeout_s is required (SGLang --watchdog-timeout; its default is not pinned)")
    if p.kv_cache_dtype not in SGLANG_KV_CACHE_DTYPES:
        problems.append(f"kv_cache_dtype {p.kv_cache_dtype!r} is not an SGLang --kv-cache-dtype "
                        f"(one of {', '.join(SGLANG_KV_CACHE_DTYPES)})")
    return problems


ENGINE_RULES = {"vllm": _vllm_problems, "sglang": _sglang_problems}


def site_profiles_dir(site_dir: str | None) -> Path | None:
    """The site's own profiles (SITE/profiles/), or None without a site."""
    return Path(site_dir) / "profiles" if site_dir else None


def profile_names(site_dir: str | None = None) -> list[str]:
    """The shipped profiles' names, and the site's (a site's NAME.yaml replaces the shipped NAME.yaml)."""
    dirs = [PROFILES_DIR, *filter(None, [site_profiles_dir(site_dir)])]
    return sorted({p.stem for d in dirs for p in d.glob("*.yaml")})


def profile_path(name: str, site_dir: str | None = None) -> Path:
    """The file of profile `name`: the site's profiles/NAME.yaml when there is one (the user's own, or a
    shipped profile changed by the user without editing a tracked file), else the shipped one."""
    site = site_profiles_dir(site_dir)
    if site is not None and (site / f"{name}.yaml").is_file():
        return site / f"{name}.yaml"
    return PROFILES_DIR / f"{name}.yaml"


def load_profile(name: str, recipe_overrides: dict | None = None, extra_args=(), parallel: dict | None = None,
                 engine_version: str | None = None, site_dir: str | None = None) -> Profile:
    """The named profile, validated; recipe_overrides (from node data) replace recipe fields,
    extra_args (node data) follow the profile's and parallel (the group's TP and PP, node data)
    replaces the profile's sizes before validation (so every engine rule sees them). site_dir (node
    data serving_site): its profiles/NAME.yaml is read instead of the shipped one."""
    path = profile_path(name, site_dir)
    if name not in profile_names(site_dir):
        where = f" (shipped, and the site's {site_profiles_dir(site_dir)})" if site_dir else ""
        raise ValueError(f"no profile {name!r}; profiles{where}: {', '.join(profile_names(site_dir))}")
    data, node = profile_file.read(path)  # a YAML error names the file, line and column
    if not isinstance(data, dict):
        raise ValueError(f"profile {name!r} ({path} line 1): the file must be a mapping of profile fields, found "
                         f"{type(data).__name__} {data!r:.60}")
    where = str(path)
    if "base" in data:  # a site's profile that changes a shipped one's fields instead of copying it whole
        where += f", on {PROFILES_DIR / str(data['base'])}.yaml"
        data = _on_base(name, path, data, node)
    if recipe_overrides and isinstance(data.get("recipe", {}), dict):  # else the model refuses the file's recipe
        data["recipe"] = {**data.get("recipe", {}), **recipe_overrides}
    if extra_args and isinstance(data.get("extra_args", []), list):
        data["extra_args"] = [*data.get("extra_args", []), *extra_args]
    data.update(parallel or {})
    if engine_version is not None:  # the node data's serving_engine_version: the bumped recipe's release
        data["engine_version"] = engine_version
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise ValueError(f"profile {name!r} ({where}): {profile_file.describe(err, node)}") from None


def _on_base(name: str, path: Path, data: dict, node) -> dict:
    """A site profile's `base: SHIPPED` and its fields: the shipped profile's fields, each one the site's
    file gives replaced whole (a map such as env or recipe too: give all of it); `name` is the site
    file's, NAME when it gives none. The base is a shipped profile (roles/serving/profiles/), itself
    whole: a site file cannot base on another site file, so no chain hides where a value came from."""
    base = data.pop("base")
    shipped = profile_names()  # without a site: the shipped ones
    if not isinstance(base, str) or base not in shipped:
        line = profile_file.line_of(node, ("base",))
        raise ValueError(f"profile {name!r} ({path} line {line}): base = {base!r}: name a shipped profile "
                         f"(roles/serving/profiles/): {', '.join(shipped)}")
    shipped_data, _ = profile_file.read(PROFILES_DIR / f"{base}.yaml")
    return {**shipped_data, **data, "name": data.get("name", name)}


class ServingData(BaseModel):
    serving_profile: str = Field(
        "glm-5.3-flash-exl3", description="the profile the pair serves: a file in `roles/serving/profiles/`, or the "
        "site's `profiles/` (found first)"
    )
    serving_site: str | None = Field(
        None, pattern=r"^/", description="the site directory (the user's data, outside the checkout's tracked "
        "files): its `profiles/NAME.yaml` is served instead of the shipped `roles/serving/profiles/NAME.yaml`. "
        "sparks() sets it to the inventory file's directory; none: the shipped profiles only",
        json_schema_extra={"set_in": "inventory (sparks() sets it)"},
    )
    serving_recipe_repository: str | None = Field(
        None, description="override of the profile's recipe repository (a mirror; the lab's own)"
    )
    serving_recipe_commit: str | None = Field(
        None, pattern=r"^[0-9a-f]{7,40}$", description="override of the profile's pinned recipe commit (bump it here "
        "to upgrade): the full 40-hex SHA; an abbreviated one is refused at prepare, naming the full SHA where the "
        "head can resolve it"
    )
    serving_engine_version: str | None = Field(
        None,
        description="override of the profile's engine_version: the engine release the image of "
        "serving_recipe_commit ships, as its package names itself (e.g. 0.31.0+cpu), when a bump moves the "
        "recipe to another release. The check before any connection holds VLLM_*/SGLANG_* pins to that "
        "release's snapshot; whatever it says, the engine in the built image judges them again before the "
        "pair stops (step 7a), and a label that was not bumped is caught there",
    )
    _serving_engine_version = field_validator("serving_engine_version")(
        classmethod(lambda cls, v: v if v is None or release(v) else v))  # a PEP 440 version, else refused here
    serving_tensor_parallel_size: int | None = Field(
        None, ge=1, description="the serving group's TP, replacing the profile's `tensor_parallel_size` (none: the "
        "profile's); with `serving_pipeline_parallel_size`, TP x PP = the group's node count",
        json_schema_extra={"set_in": "group_data or inventory, per group"},
    )
    serving_pipeline_parallel_size: int | None = Field(
        None, ge=1, description="the serving group's PP, replacing the profile's `pipeline_parallel_size`: four "
        "nodes serve a pair's profile at TP 2 x PP 2",
        json_schema_extra={"set_in": "group_data or inventory, per group"},
    )
    serving_start_at_boot: bool = Field(True, description="enable the units so the pair starts at boot")
    serving_health_timeout_s: int = Field(
        1200, ge=10, description="how long a deploy waits for the head's `/health` (a cold start takes 6-12 min)"
    )
    serving_drop_caches: bool = Field(
        True, description="drop the page cache before each start (unified memory counts it as used)"
    )
    serving_prune_other_profiles: bool = Field(
        False, description="remove the images of profiles other than the served one (kept by default, for switching "
        "back)"
    )
    serving_env_pins: dict[str, str] = Field(
        default_factory=dict,
        description="environment pinned in data on top of the profile's (a recipe default that drifted upstream)",
    )
    _no_empty_pins = field_validator("serving_env_pins")(classmethod(lambda cls, env: refuse_empty_values(env)))
    serving_extra_args: list[str] = Field(
        default_factory=list,
        description="engine flags with their values after the profile's `extra_args`, on every rank (a flag the "
        "recipe's launcher passes, adopted; see exact recipe drift); a flag sparkfleet renders is refused",
    )
    _extra_args = field_validator("serving_extra_args")(classmethod(lambda cls, args: check_extra_args(args)))

    serving_ulimit_memlock: str = Field(
        "-1",
        pattern=r"^(-1|[0-9]+(:[0-9]+)?)$",
        description="`--ulimit memlock` of the serving containers: -1 (unlimited: RDMA registers memory); a number "
        "only where the machine cannot grant unlimited (the lab)",
    )
    serving_dir: str = Field("/etc/sparkfleet", pattern=r"^/", description="where the ranks' root-only environment "
    "files live")
    serving_api_key_file: str | None = Field(
        None, pattern=r"^/", description="root-only file on the head with the API key (one line, 16-512 of "
        "`A-Za-z0-9._~+/=-`); none: sparkfleet generates `<serving_dir>/api-key` (32 random bytes, hex) on the first "
        "deploy. Given and absent, or readable by anyone but root: the deploy stops at prepare. The API proxy checks "
        "the key (from a root-only file derived from this one); the engine gets none. See docs/security.md#the-api-key"
    )
    serving_media_domains: list[str] = Field(
        default_factory=list, description="vision profiles: the hostnames the engine may fetch image and video URLs "
        "from (`--allowed-media-domains`); empty: none (only inline `data:` URLs), local paths never"
    )
    _media_domains = field_validator("serving_media_domains")(classmethod(lambda cls, v: check_media_domains(v)))
    serving_engine_advisories_acknowledged: dict[str, str] = Field(
        default_factory=dict,
        description="published security advisories of the engine (sparkfleet/model/engine_advisories.py: id, "
        "affected range, first fixed version, why sparkfleet's exposure reaches it, the record) accepted for this "
        "group's engine release, each id with your reason; the deploy refuses an engine release a reachable "
        "advisory affects unless it is here, and then goes on with a warning. See "
        "docs/security.md#engine-advisories",
        json_schema_extra={"set_in": "group_data or inventory, per group"},
    )

    @field_validator("serving_engine_advisories_acknowledged")
    @classmethod
    def _known_advisories_with_reasons(cls, acknowledged: dict[str, str]) -> dict[str, str]:
        unknown = sorted(k for k in acknowledged if k not in ADVISORY_IDS)
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not in the engine advisories table; known ids: "
                             f"{', '.join(ADVISORY_IDS)}")
        empty = sorted(k for k, reason in acknowledged.items() if not reason.strip())
        if empty:
            raise ValueError(f"{', '.join(empty)}: no reason given; say why the group may serve an affected engine "
                             f"release (it is printed at every deploy)")
        return acknowledged


def profile_models(profile) -> list[tuple[str, str]]:
    """(model id, revision) of everything the profile loads: the model, then its drafter (roles/weights
    fetches and fans out each)."""
    models = [(profile.model, profile.model_revision)]
    spec = profile.speculative
    if spec and spec.draft_model:
        models.append((spec.draft_model, spec.draft_model_revision))
    return models


def node_profile(node) -> Profile:
    """The profile a node serves, with the node data's recipe overrides and extra args applied."""
    overrides = {}
    if node.serving_recipe_repository:
        overrides["repository"] = node.serving_recipe_repository
    if node.serving_recipe_commit:
        overrides["commit"] = node.serving_recipe_commit
    parallel = {field: value for field, value in (("tensor_parallel_size", node.serving_tensor_parallel_size),
                                                   ("pipeline_parallel_size", node.serving_pipeline_parallel_size))
                if value is not None}
    return load_profile(node.serving_profile, overrides, node.serving_extra_args, parallel, node.serving_engine_version,
                        node.serving_site)


SHARED_SERVING_KEYS = ("serving_profile", "serving_site", "serving_recipe_repository", "serving_recipe_commit",
                       "serving_extra_args",
                       "serving_engine_version",
                       "serving_engine_advisories_acknowledged",
                       "serving_tensor_parallel_size", "serving_pipeline_parallel_size")


def world_size(profile: Profile) -> int:
    """The engine's world size: every TP x PP rank, one per node (one GB10 each)."""
    return profile.tensor_parallel_size * profile.pipeline_parallel_size


def parallelism_problems(profile: Profile, nodes) -> list[str]:
    """The group's node count is the profile's TP x PP: one rank per node, one GB10 GPU each (both
    engines place rank node_rank on that node; a product below the count leaves nodes idle, above it
    asks for GPUs the nodes do not have)."""
    tp, pp = profile.tensor_parallel_size, profile.pipeline_parallel_size
    if world_size(profile) == len(nodes):
        return []
    return [f"key 'serving_profile' = {profile.name!r}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} = "
            f"{tp * pp} ranks but {len(nodes)} nodes (one GB10 GPU per node: TP x PP must equal the node count; "
            f"serving_tensor_parallel_size and serving_pipeline_parallel_size set them for the group)"]
