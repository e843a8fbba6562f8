"""What each rank runs: the engine command line, its environment, and the container around it.

Pure functions of (profile, cluster, node): the golden tests render exactly what a deploy writes.
Engines are a table (ENGINES): vLLM (mp backend, --headless on every rank > 0) and SGLang (the
same command on every rank, joined over --dist-init-addr; it has no --headless). The units and
the rank environment are the same for both.
"""
import json
import re
from typing import Callable

from sparkfleet.model.kernel_cache import CACHE_VARS, CONTAINER_CACHE_ROOT
from sparkfleet.model.serving import NO_MEDIA_DOMAIN, Profile

# Where every rank's container sees weights_dir (read-only): a model is /models/<model id>.
CONTAINER_WEIGHTS_ROOT = "/models"

# The API key's files on the head, derived from serving_api_key_file (roles/serving/api_key.py), all
# root-only in serving_dir: curl's config for the probes and the API proxy's pattern file
# (roles/api_proxy). The engine gets none: the proxy checks the key in front of it.
KEY_CURL_FILE, KEY_PROXY_FILE = "api-key.curl", "api-key.haproxy"
# Where the head's engine serves HTTP: loopback only, behind the API proxy (roles/api_proxy), which
# alone listens on the profile's port and alone checks the key: neither engine's own key check covers
# every route it serves (sparkfleet/model/api_proxy.py), so the engine is given no key at all, and the
# firewall lets only root's and the proxy's sockets reach this port (sparkfleet/firewall_rules.py).
ENGINE_HTTP_HOST = "127.0.0.1"

# SGLang 0.5.23 logs every resolved argument at INFO when it starts, an --api-key among them
# (sglang/srt/entrypoints/engine.py: logger.info(f"server_args={...}"), only watermark secrets
# redacted). A logging config named by SGLANG_LOGGING_CONFIG_PATH replaces SGLang's own
# (sglang/srt/utils/common.py, configure_logger: logging.config.dictConfig of the file): the same
# format and level, with that one module's logger raised to WARNING. SGLang is given no key any more
# (the API proxy checks it) and data refuses secret flags (SECRET_FLAGS), so the line holds none
# today; the config stays as the second line of defence it was. On every rank, mounted read-only.
SGLANG_LOGGING_FILE = "sglang-logging.json"
SGLANG_LOGGING_CONFIG = f"/run/sparkfleet/{SGLANG_LOGGING_FILE}"
SGLANG_QUIET_LOGGERS = ("sglang.srt.entrypoints.engine",)


def mounted_files(profile: Profile, node) -> dict[str, tuple[str, str]]:
    """{path: (text, mode)} of the files in serving_dir every container of this rank mounts besides
    its env file (SGLang's logging config). Written before the prewarm, which mounts them too: a
    bind mount of a missing path makes docker create a directory there."""
    if profile.engine != "sglang":
        return {}
    text = json.dumps(sglang_logging_config(), indent=1, sort_keys=True) + "\n"
    return {f"{node.serving_dir}/{SGLANG_LOGGING_FILE}": (text, "0644")}


def sglang_logging_config() -> dict:
    """SGLang's own default (configure_logger: basicConfig, INFO, "[%(asctime)s] %(message)s" on
    stderr), with the loggers that print the resolved arguments at WARNING."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"sglang": {"format": "[%(asctime)s] %(message)s", "datefmt": "%Y-%m-%d %H:%M:%S"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "sglang", "stream": "ext://sys.stderr"}},
        "root": {"level": "INFO", "handlers": ["stderr"]},
        "loggers": {name: {"level": "WARNING"} for name in SGLANG_QUIET_LOGGERS},
    }

# Never rendered, whatever a profile says: each hard-froze both machines in the field.
FORBIDDEN_ARGS = ("--load-format dummy", "--no-ple-offload-embedding")


# Each rank's unit, and its container (docker run --name).
HEAD_UNIT, WORKER_UNIT = "sparkfleet-head", "sparkfleet-worker"


def unit_name(node) -> str:
    return HEAD_UNIT if node.is_head else WORKER_UNIT


def model_path(model: str) -> str:
    """A model's directory inside the container (roles/weights put it there, at the pinned revision)."""
    return f"{CONTAINER_WEIGHTS_ROOT}/{model}"


def vllm_args(profile: Profile, cluster, node) -> list[str]:
    """`vllm serve` for this rank: the mp backend across nodes, --headless on every rank > 0."""
    # The local copy roles/weights verified, never the hub: every rank loads the same bytes.
    args = ["vllm", "serve", model_path(profile.model), "--served-model-name", profile.api_model_name]
    args += [
        "--tensor-parallel-size", str(profile.tensor_parallel_size),
        # Always rendered, 1 included (vllm/engine/arg_utils.py --pipeline-parallel-size); the mp
        # executor spans the nodes with PP as with TP (vllm/v1/executor/multiproc_executor.py).
        "--pipeline-parallel-size", str(profile.pipeline_parallel_size),
        # Ray's memory monitor killed the head at 115.62/121.69 GB of unified memory; mp has none.
        "--distributed-executor-backend", "mp",
        "--nnodes", str(len(cluster.nodes)),
        "--node-rank", str(node.rank),
        "--master-addr", cluster.head.fabric_ip,
        "--master-port", str(profile.master_port),
        # torch.distributed's own bound on a collective that makes no progress (vllm/config/parallel.py).
        "--distributed-timeout-seconds", str(profile.distributed_timeout_s),
    ]
    if not node.is_head:
        # Without it the follower crashes: "collective_rpc should not be called on follower node".
        args.append("--headless")
    args += [
        "--gpu-memory-utilization", str(profile.gpu_memory_utilization),
        "--max-model-len", str(profile.max_model_len),
        "--max-num-batched-tokens", str(profile.max_num_batched_tokens),
        "--kv-cache-dtype", profile.kv_cache_dtype,
    ]
    if profile.quantization:
        args += ["--quantization", profile.quantization]
    if profile.speculative:
        spec = {"method": profile.speculative.method, "num_speculative_tokens": profile.speculative.num_speculative_tokens}
        if profile.speculative.draft_model:
            spec["model"] = model_path(profile.speculative.draft_model)
        if profile.speculative.draft_tensor_parallel_size:
            spec["draft_tensor_parallel_size"] = profile.speculative.draft_tensor_parallel_size
        if profile.speculative.draft_kv_cache_dtype:
            spec["kv_cache_dtype"] = profile.speculative.draft_kv_cache_dtype
        args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    if profile.tool_call_parser:
        args += ["--tool-call-parser", profile.tool_call_parser, "--enable-auto-tool-choice"]
    if profile.reasoning_parser:
        args += ["--reasoning-parser", profile.reasoning_parser]
    if not profile.vision:
        args += ["--limit-mm-per-prompt", json.dumps({"image": 0, "video": 0}, separators=(",", ":"))]
    else:
        # What an image URL may be fetched from; --allowed-local-media-path stays at its default
        # (empty: no local file) (vllm/config/model.py).
        args += ["--allowed-media-domains", *media_domains(node)]
    if profile.trust_remote_code:
        args.append("--trust-remote-code")
    if node.is_head:
        # No --api-key and no VLLM_API_KEY (vllm/entrypoints/serve/middleware/register.py reads either):
        # the API proxy checks the key; the engine's own check would guard /v1, /v2, /inference and
        # /cohere only (authenticate.py GUARDED_PREFIX), so it adds nothing behind the proxy.
        args += ["--host", ENGINE_HTTP_HOST, "--port", str(node.api_proxy_engine_port)]
    return args


def media_domains(node) -> list[str]:
    return list(node.serving_media_domains) or [NO_MEDIA_DOMAIN]


def sglang_args(profile: Profile, cluster, node) -> list[str]:
    """`python3 -m sglang.launch_server` for this rank: every rank runs it with its --node-rank and
    joins the head's --dist-init-addr; only rank 0 serves HTTP. Flag names as in SGLang's
    python/sglang/srt/server_args.py."""
    args = ["python3", "-m", "sglang.launch_server", "--model-path", model_path(profile.model),
            "--served-model-name", profile.api_model_name]
    args += [
        # --tp-size is the flag's own name; the docs' `--tp` only works as an argparse abbreviation.
        "--tp-size", str(profile.tensor_parallel_size),
        # Always rendered, 1 included (sglang/srt/arg_groups/fields/parallel.py pp_size); each node's
        # stage and TP rank follow from --nnodes/--node-rank (sglang/srt/entrypoints/engine.py
        # _calculate_rank_ranges).
        "--pp-size", str(profile.pipeline_parallel_size),
        "--dist-init-addr", f"{cluster.head.fabric_ip}:{profile.master_port}",
        "--nnodes", str(len(cluster.nodes)),
        "--node-rank", str(node.rank),
        "--mem-fraction-static", str(profile.gpu_memory_utilization),
        "--context-length", str(profile.max_model_len),
        "--chunked-prefill-size", str(profile.max_num_batched_tokens),
        "--kv-cache-dtype", profile.kv_cache_dtype,
        # torch.distributed's timeout, and SGLang's own watchdog on a scheduler step that never ends.
        "--dist-timeout", str(profile.distributed_timeout_s),
        "--watchdog-timeout", str(profile.watchdog_timeout_s),
        # Its Prometheus metrics (off by default: sglang/srt/arg_groups/fields/observability.py
        # enable_metrics), on the head's HTTP server at /metrics (sglang/srt/entrypoints/http_server.py,
        # sglang/srt/utils/common.py add_prometheus_middleware), which its --api-key check leaves open
        # (sglang/srt/utils/auth.py): roles/monitoring scrapes them and the watchdog weighs a failed
        # probe against their counters (roles/watchdog/node_config.py PROGRESS_METRICS).
        "--enable-metrics",
    ]
    if profile.quantization:
        args += ["--quantization", profile.quantization]
    spec = profile.speculative
    if spec:
        args += [
            "--speculative-algorithm", spec.method,
            "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk),
            "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        ]
        if spec.draft_model:
            args += ["--speculative-draft-model-path", model_path(spec.draft_model)]
    if profile.tool_call_parser:
        args += ["--tool-call-parser", profile.tool_call_parser]  # SGLang has no --enable-auto-tool-choice
    if profile.reasoning_parser:
        args += ["--reasoning-parser", profile.reasoning_parser]
    # Both explicit: SGLang's own default depends on the checkpoint's architecture.
    args.append("--enable-multimodal" if profile.vision else "--language-model-only")
    if profile.vision:
        # sglang/srt/arg_groups/fields/mm.py: client-supplied media URLs, these hostnames only.
        args += ["--allowed-media-domains", *media_domains(node)]
    if profile.trust_remote_code:
        args.append("--trust-remote-code")
    if node.is_head:
        # No --api-key (SGLang reads the key from that flag alone; no variable in sglang/srt/environ.py):
        # the API proxy checks it. Without a key SGLang's middleware still refuses its ADMIN_FORCE routes
        # (sglang/srt/utils/auth.py decide_request_auth: 403 with no admin key), and its ADMIN_OPTIONAL
        # ones are open to whoever reaches this port: root and the proxy, which forwards keyed requests
        # only, the same holders of the key as with it.
        args += ["--host", ENGINE_HTTP_HOST, "--port", str(node.api_proxy_engine_port)]
    return args


ENGINES: dict[str, Callable] = {"vllm": vllm_args, "sglang": sglang_args}

# Each engine metric sparkfleet reads, by vLLM's name -> SGLang's (SGLang 0.5.23,
# sglang/srt/observability/metrics_collector.py; served with --enable-metrics, above). One place for
# the watchdog's progress counters (roles/watchdog/node_config.py) and roles/monitoring's live figures;
# vLLM's completed requests are SGLang's processed ones.
SGLANG_METRICS = {
    "vllm:prompt_tokens_total": "sglang:prompt_tokens_total",
    "vllm:generation_tokens_total": "sglang:generation_tokens_total",
    "vllm:request_success_total": "sglang:num_requests_total",
    "vllm:num_requests_running": "sglang:num_running_reqs",
    "vllm:num_requests_waiting": "sglang:num_queue_reqs",
    "vllm:kv_cache_usage_perc": "sglang:token_usage",
    "vllm:time_to_first_token_seconds_bucket": "sglang:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket": "sglang:inter_token_latency_seconds_bucket",
}


def flag_names(words) -> set[str]:
    """The flags among `words` (`--x=v` is `--x`; `--a_b` is `--a-b`, as vLLM reads both)."""
    return {w.split("=", 1)[0].replace("_", "-") for w in words if w.startswith("--")}


def engine_args(profile: Profile, cluster, node) -> list[str]:
    args = ENGINES[profile.engine](profile, cluster, node)
    # The profile's extra args (and serving_extra_args) last, on every rank; never a second value
    # for a flag sparkfleet renders from a field.
    twice = sorted(flag_names(profile.extra_args) & flag_names(args))
    if twice:
        raise ValueError(f"{node.name}: {', '.join(twice)} in extra args (the profile's extra_args, serving_extra_args) "
                         f"repeat a flag sparkfleet renders from the profile's fields; set the field instead")
    args = args + list(profile.extra_args)
    joined = " ".join(w.replace("=", " ", 1) if w.startswith("--") else w for w in args)
    for forbidden in FORBIDDEN_ARGS:
        if forbidden in joined:
            raise ValueError(f"{node.name}: refusing to render {forbidden!r} (it can hard-freeze both machines)")
    return args


def pinned_env(profile: Profile, node) -> dict[str, str]:
    """Every value sparkfleet pins: the profile's environment and its recipe launcher's, then the
    node data's pins."""
    return {**profile.env, **profile.launcher_env, **node.serving_env_pins}


def rank_env(profile: Profile, cluster, node, gid_index: int | None = None) -> dict[str, str]:
    """The environment of one rank: the profile's pinned values, then what is this rank's own."""
    env = pinned_env(profile, node)
    fabric = node.fabric_netdev
    # The rendezvous address and port are flags (vLLM --master-addr/--master-port, SGLang
    # --dist-init-addr): neither engine's multi-node path reads MASTER_ADDR or MASTER_PORT.
    if profile.engine == "vllm":
        env["VLLM_HOST_IP"] = node.fabric_ip  # this rank's address for vLLM's own sockets (vllm/envs.py)
    else:
        env["SGLANG_LOGGING_CONFIG_PATH"] = SGLANG_LOGGING_CONFIG  # no API key in the log (see above)
    env.update(
        {
            # Every collective on the CX7 link, never the management network (NCCL; torch's gloo).
            "NCCL_SOCKET_IFNAME": fabric,
            "GLOO_SOCKET_IFNAME": fabric,
            # Weights are local and verified (roles/weights); the hub is never asked at start.
            "HF_HUB_OFFLINE": "1",
        }
    )
    # Every JIT cache in the mounted generation (roles/kernel_cache), none in the container's layer.
    env.update({var: f"{CONTAINER_CACHE_ROOT}/{c.subdir}" for var, c in CACHE_VARS[profile.engine].items()})
    if node.rdma_hca and len(node.rdma_hcas) > 1:
        # Both halves of the port (NVIDIA/nccl v2.28.9-1, src/transport/net_ib.cc). NCCL_IB_GID_INDEX is
        # one value for every HCA (ncclIbGetGidIndex, L470: an index >= 0 is used as is on each device),
        # and the halves' indices need not agree: -1 has NCCL choose per HCA, the first valid (not
        # fe80::) GID of AF_INET whose type is RoCE v2 (ncclUpdateGidIndex, L428). The unit checks at
        # every start that this choice is each half's own address (sfl_gid.sh --check).
        # NCCL_IB_HCA: "=" matches the names exactly, not as prefixes (src/misc/utils.cc matchIf).
        # NCCL_IB_MERGE_NICS=1 (L509) lets NCCL fuse devices its topology puts on one NIC port; a
        # Spark's two controllers sit in different PCI domains (0000: and 0002:), so NCCL keeps them
        # two NICs and spreads its channels over both (src/graph/topo.cc ncclTopoAutoMerge).
        env.update(
            {
                "NCCL_IB_HCA": "=" + ",".join(node.rdma_hcas),
                "NCCL_IB_GID_INDEX": "-1",
                "NCCL_IB_ADDR_FAMILY": "AF_INET",
                "NCCL_IB_ROCE_VERSION_NUM": "2",
                "NCCL_IB_MERGE_NICS": "1",
            }
        )
    elif node.rdma_hca:
        if gid_index is None:
            raise ValueError(
                f"{node.name}: rdma_hca is {node.rdma_hca} but no RoCE v2 GID index was resolved; an empty "
                f"NCCL_IB_GID_INDEX is read as 0 (the link-local GID)"
            )
        env.update(
            {
                "NCCL_IB_HCA": node.rdma_hca,
                "NCCL_IB_GID_INDEX": str(gid_index),
                "NCCL_IB_ADDR_FAMILY": "AF_INET",
                "NCCL_IB_ROCE_VERSION_NUM": "2",
            }
        )
    else:
        env["NCCL_IB_DISABLE"] = "1"  # TCP sockets over the fabric netdev
    return env


def env_file_path(node, serving_dir: str) -> str:
    return f"{serving_dir}/{unit_name(node)}.env"


# A worker runs the image by the digest the head pushed (roles/image writes it after the pull, in
# this file, as IMAGE_VAR=<registry>/<repo>@sha256:...): a later push under the same tag to the
# head's registry, which any fabric peer can make, cannot change what a worker's unit starts, and a
# worker missing the image pulls exactly that manifest again. The head runs its own build by tag:
# the tag is local to its Docker, which nothing on the fabric can write.
IMAGE_VAR = "SPARKFLEET_IMAGE"
IMAGE_WORD = "${" + IMAGE_VAR + "}"  # systemd expands it from the unit's EnvironmentFile, as one word


def image_pin_path(node) -> str:
    """The worker's pinned image reference (roles/image, after its pull by digest)."""
    return f"{node.serving_dir}/{unit_name(node)}.image"


def served_image(profile: Profile, node) -> str:
    """The image word of a rank's `docker run`: the head's local tag, a worker's pinned digest."""
    return profile.image_ref if node.is_head else IMAGE_WORD


# The engine's privileges in its container: every capability dropped, none gained by exec.
#
# Docker gives a container 14 capabilities by default (moby/moby oci/caps/defaults.go: CHOWN,
# DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW, SETGID, SETUID, SETFCAP, SETPCAP, NET_BIND_SERVICE,
# SYS_CHROOT, KILL, AUDIT_WRITE). The engine, root in its container, uses none of them: it changes no
# file's owner or mode and no uid (no chown, setuid, setgid, chroot or mknod in vLLM 0.32.0's or
# SGLang 0.5.23's Python, read from their wheels); every file it writes (the kernel caches,
# /dev/shm, /tmp) belongs to root, its own uid, and the weights it reads are root's (roles/weights
# and roles/fanout write them as root); it signals only its own processes (same uid); it binds no
# port below 1024 (api_proxy_engine_port and the profile's master_port are >= 1024) and opens no raw
# socket (NCCL's RoCE uses verbs on reliable-connected queue pairs, gloo and ZMQ TCP). Raising its
# open-files and stack soft limits up to the hard ones (vllm/utils/system_utils.py set_ulimit,
# sglang/srt/utils/common.py set_ulimit) needs none.
# Two the engines name were never in Docker's set, and are not needed here either:
# - SYS_NICE: NUMA memory binding asks for it (vllm/utils/numa_utils.py: "try adding --cap-add
#   SYS_NICE"; sglang/srt/utils/numa_utils.py). vLLM binds only with --numa-bind (default off:
#   vllm/config/parallel.py numa_bind), which sparkfleet never renders; SGLang only on a machine with
#   a second NUMA node (_is_numa_available: /sys/devices/system/node/node1), and without SYS_NICE it
#   binds CPUs alone. Docker's seccomp profile allows set_mempolicy and mbind only with SYS_NICE
#   (moby/moby profiles/seccomp/default.json), so the engines already ran without them (the lab's CPU
#   vLLM logs its numa_migrate_pages failure as a warning: csrc/cpu/utils.cpp).
# - IPC_LOCK: RDMA memory registration counts against RLIMIT_MEMLOCK unless the process has it
#   (linux drivers/infiniband/core/umem.c ib_umem_get); the container's memlock limit is
#   serving_ulimit_memlock, unlimited by default (--ulimit, set by Docker before the engine starts).
# A recipe image whose own entrypoint needs one of Docker's set back names it in its profile
# (container.cap_add). no-new-privileges: no exec in the container (a setuid binary, a file with
# capabilities) can gain what the engine was not given.
ENGINE_SECURITY_ARGS = ["--cap-drop=ALL", "--security-opt=no-new-privileges"]


def privilege_args(profile: Profile) -> list[str]:
    """The capability and no-new-privileges options of every container the engine runs in."""
    return ENGINE_SECURITY_ARGS[:1] + [f"--cap-add={cap}" for cap in profile.container.cap_add] + ENGINE_SECURITY_ARGS[1:]


def docker_args(profile: Profile, node, env_file: str, name: str | None = None, detach: bool = False,
                remove: bool = True) -> list[str]:
    """`remove` False: the container stays when its engine exits, so its log can still be read (the
    prewarm, which removes its containers itself)."""
    c = profile.container
    # --init: a real PID 1 in the container forwards signals, so `docker stop` never waits out the
    # grace period on an engine that has not installed its SIGTERM handler yet.
    args = ["/usr/bin/docker", "run"] + (["--detach"] if detach else [])
    args += (["--rm"] if remove else []) + ["--init", "--name", name or unit_name(node), f"--stop-timeout={c.stop_timeout_s}"]
    args += privilege_args(profile)
    if c.network_host:
        args.append("--network=host")
    if c.ipc_host:
        args.append("--ipc=host")
    args += [f"--shm-size={c.shm_size}", f"--ulimit=memlock={node.serving_ulimit_memlock}"]
    if node.gpu_expected:
        args.append("--gpus=all")
    devices = list(c.devices) + (["/dev/infiniband"] if node.rdma_hca else [])
    args += [f"--device={d}" for d in devices]
    # Weights read-only; the kernel caches of the served image's generation ('current' link).
    args += [
        f"--volume={node.weights_dir}:{CONTAINER_WEIGHTS_ROOT}:ro",
        f"--volume={node.kernel_cache_dir}/current:{CONTAINER_CACHE_ROOT}",
    ]
    if profile.engine == "sglang":
        args.append(f"--volume={node.serving_dir}/{SGLANG_LOGGING_FILE}:{SGLANG_LOGGING_CONFIG}:ro")
    # The rank's environment; no API key, in it or beside it (ENGINE_HTTP_HOST says why).
    args += [f"--env-file={env_file}"]
    args.append(served_image(profile, node))
    return args


_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def systemd_quote(arg: str) -> str:
    """One ExecStart word: '%' and '$' escaped for systemd, single-quoted when it has anything special;
    the pinned image's variable (IMAGE_WORD) as it is, for systemd to expand."""
    if arg == IMAGE_WORD:
        return arg
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if _SAFE.match(arg):
        return escaped
    return "'" + escaped.replace("\\", "\\\\").replace("'", "\\'") + "'"


def exec_start(profile: Profile, cluster, node, env_file: str) -> str:
    """The ExecStart value: one docker option per line, then the image and the engine's command
    (`vllm serve MODEL`, `python3 -m sglang.launch_server`), one flag with its value per line."""
    lines: list[list[str]] = []
    image = served_image(profile, node)
    for word in docker_args(profile, node, env_file) + engine_args(profile, cluster, node):
        if not lines or word.startswith("--") or word == image:
            lines.append([word])
        else:
            lines[-1].append(word)
    return " \\\n    ".join(" ".join(systemd_quote(w) for w in line) for line in lines)
