"""Rendered units and environment files of every shipped profile, on both ranks, for real-hardware
data (GPU, RDMA with a per-rank GID index) and for lab data; plus the engine commands' rules
(vLLM: --headless worker; SGLang: the same command on every rank, joined over --dist-init-addr)."""
import contextlib
import json
import os
import shlex
import tempfile
from pathlib import Path
from unittest import mock

import pytest
import yaml

import sparkfleet.model.serving as schema
from roles.serving.checks import rendered_files, rendered_paths
from sparkfleet.model.engine import FORBIDDEN_ARGS, IMAGE_WORD, engine_args, systemd_quote
from sparkfleet.model.serving import load_profile, profile_names
from sparkfleet.config import build_cluster
from tests.unit.helpers import GROUP_NODES, ONE_HALF, group, pair
from tests.unit.test_templates import GOLDEN, check_golden

LAB = {
    "netplan_renderer": "networkd", "rdma_hca": None, "rdma_twin_hca": None, "gpu_expected": False, "serving_drop_caches": False,
    "serving_recipe_repository": "git://198.18.0.1/recipe.git",
    "serving_recipe_commit": "a510aeb6493132c2c4ec841d58e0881d8734d7ed", "serving_ulimit_memlock": "8388608",
}
# Per-rank RoCE v2 GID indexes as recorded on two Sparks: they differ per node (spark-c and spark-d,
# of a four-node group, take the same two).
GIDS = {"spark-a": 3, "spark-b": 5, "spark-c": 3, "spark-d": 5}
# The schema's default profile; its golden files keep their first names (kind-node-file), every
# other profile's live in golden/<profile>/.
DEFAULT_PROFILE = "glm-5.3-flash-exl3"
PROFILES = profile_names()
ENGINE = {name: load_profile(name).engine for name in PROFILES}
VLLM_PROFILES = [n for n in PROFILES if ENGINE[n] == "vllm"]
SGLANG_PROFILES = [n for n in PROFILES if ENGINE[n] == "sglang"]


def cluster(kind, profile=DEFAULT_PROFILE):
    """kind: "spark" (real hardware, both halves of the port), "spark1" (a port of one half, one HCA)
    or "lab"."""
    data = {"serving_profile": profile, **(LAB if kind == "lab" else ONE_HALF if kind == "spark1" else {})}
    return build_cluster(pair(**{"spark-a": data, "spark-b": data}))


# A four-node serving group of every shipped profile: TP 2 x PP 2 (its profile "<name>-tp2pp2", the
# shipped one with pipeline_parallel_size 2).
PP_VARIANT = "-tp2pp2"


@contextlib.contextmanager
def parallel_variants():
    """The shipped profiles and, beside each, its TP 2 x PP 2 variant (PP_VARIANT), in a temporary
    profiles directory that load_profile reads while the context lasts."""
    with tempfile.TemporaryDirectory(prefix="sfl-profiles-") as tmp:
        for name in PROFILES:
            text = (schema.PROFILES_DIR / f"{name}.yaml").read_text()
            (Path(tmp) / f"{name}.yaml").write_text(text)
            data = yaml.safe_load(text)
            data.update(name=name + PP_VARIANT, tensor_parallel_size=2, pipeline_parallel_size=2)
            (Path(tmp) / f"{name}{PP_VARIANT}.yaml").write_text(yaml.safe_dump(data))
        with mock.patch.object(schema, "PROFILES_DIR", Path(tmp)):
            yield


def group_cluster(kind, profile, count=4):
    """A serving group of `count` nodes (spark-a..) serving `profile`, built as cluster() builds the pair."""
    data = {"serving_profile": profile, **(LAB if kind == "lab" else {})}
    return build_cluster(group(count, **{name: data for name in GROUP_NODES[:count]}))


def files_of(kind, name, profile=DEFAULT_PROFILE):
    c = cluster(kind, profile)
    node = c.node(name)
    return rendered_files(c, node, GIDS[name] if node.rdma_hca else None)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", ["spark", "lab"])
def test_the_paths_the_facts_read_are_the_paths_rendered(kind, profile):
    """serving_facts reads each file's sha1 at the paths rendered_paths() names, without rendering."""
    c = cluster(kind, profile)
    for name in ("spark-a", "spark-b"):
        assert rendered_paths(c.node(name)) == list(files_of(kind, name, profile)), (kind, name, profile)


def golden_name(kind, name, profile, path):
    base = f"{kind}-{name}-{path.rsplit('/', 1)[1]}"
    return base if profile == DEFAULT_PROFILE else f"{profile}/{base}"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", ["spark", "lab"])
@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_units_and_env_match_golden(kind, name, profile):
    if os.environ.get("SPARKFLEET_UPDATE_GOLDEN") and profile != DEFAULT_PROFILE:
        (GOLDEN / profile).mkdir(exist_ok=True)
    for path, (text, _mode) in files_of(kind, name, profile).items():
        check_golden(golden_name(kind, name, profile, path), text)


def env_of(kind, name, profile=DEFAULT_PROFILE) -> dict:
    [(text, mode)] = [v for p, v in files_of(kind, name, profile).items() if p.endswith(".env")]
    assert mode == "0600"
    return dict(l.split("=", 1) for l in text.splitlines() if l and not l.startswith("#"))


def exec_words(kind, name, profile=DEFAULT_PROFILE) -> list[str]:
    [(text, _)] = [v for p, v in files_of(kind, name, profile).items() if p.endswith(".service")]
    start = text.split("ExecStart=", 1)[1].split("\nExecStop=", 1)[0].replace("\\\n", " ")
    return shlex.split(start.replace("%%", "%").replace("$$", "$"))


def engine_words(words: list[str], profile: str) -> list[str]:
    """The engine's part of an ExecStart: what follows the image (the head's tagged with the data's
    commit, a worker's its pinned digest's variable)."""
    [image] = [w for w in words if w.startswith(load_profile(profile).image + ":") or w == IMAGE_WORD]
    return words[words.index(image) + 1:]


@pytest.mark.parametrize("kind", ["spark", "lab"])
def test_a_worker_runs_its_pinned_digest_and_the_head_its_own_build(kind):
    """The worker's unit reads its pin file (written after its pull by digest) and starts the image it
    names; the head's starts its local build by tag, which nothing on the fabric can move."""
    head, worker = exec_words(kind, "spark-a"), exec_words(kind, "spark-b")
    assert any(w.startswith(load_profile(DEFAULT_PROFILE).image + ":") for w in head) and IMAGE_WORD not in head
    assert IMAGE_WORD in worker and not any(w.startswith(load_profile(DEFAULT_PROFILE).image) for w in worker)
    [(unit, _)] = [v for p, v in files_of(kind, "spark-b").items() if p.endswith(".service")]
    assert "\nEnvironmentFile=/etc/sparkfleet/sparkfleet-worker.image\n" in unit
    assert "${SPARKFLEET_IMAGE} vllm serve" in unit  # as it is, for systemd to expand: not escaped
    [(head_unit, _)] = [v for p, v in files_of(kind, "spark-a").items() if p.endswith(".service")]
    assert ".image" not in head_unit


def test_worker_is_headless_with_its_rank_and_the_head_is_not():
    head, worker = exec_words("spark", "spark-a"), exec_words("spark", "spark-b")
    assert "--headless" not in head and "--headless" in worker
    assert head[head.index("--node-rank") + 1] == "0" and worker[worker.index("--node-rank") + 1] == "1"
    for words in (head, worker):
        assert words[words.index("--master-addr") + 1] == "10.77.77.1"
        assert words[words.index("--distributed-executor-backend") + 1] == "mp"
        assert words[words.index("--nnodes") + 1] == "2"
    assert "--port" in head and "--port" not in worker


def test_shipped_profile_is_the_field_report_card():
    words = exec_words("spark", "spark-a")
    value = lambda flag: words[words.index(flag) + 1]
    assert value("--gpu-memory-utilization") == "0.79"
    assert value("--max-model-len") == "640000"
    assert value("--max-num-batched-tokens") == "2048"
    assert value("--kv-cache-dtype") == "fp8_ds_mla"
    assert value("--tool-call-parser") == "glm47" and value("--reasoning-parser") == "glm45"
    assert json.loads(value("--speculative-config")) == {
        "method": "dflash", "num_speculative_tokens": 7, "model": "/models/incoai/GLM-5.3-Flash-DFlash2",
        "draft_tensor_parallel_size": 2, "kv_cache_dtype": "auto"}
    assert value("--quantization") == "exl3" and value("--distributed-timeout-seconds") == "1800"
    assert "--limit-mm-per-prompt" not in words  # vision on
    profile = load_profile("glm-5.3-flash-exl3")
    assert profile.recipe.commit == "493cb88fc69f8ba73ac87404f429d763e2739d89"  # 493cb88, in full


def test_rank_env_pins_the_profile_and_the_rank():
    env = env_of("spark", "spark-b")
    assert env["CG_ESTIMATE"] == "0" and env["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "0"
    assert env["VLLM_HOST_IP"] == "10.77.77.2"
    # Read by neither engine: the rendezvous is a flag (--master-addr, --dist-init-addr).
    assert not {"MASTER_ADDR", "MASTER_PORT", "TP_SOCKET_IFNAME"} & set(env)
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        assert env[key] == "enp1s0f0np0"  # the bootstrap: NCCL takes one interface for it (socket.cc)
    # Both halves of the port carry the collectives; NCCL chooses each HCA's GID (one index cannot fit two).
    assert env["NCCL_IB_HCA"] == "=rocep1s0f0,roceP2p1s0f0" and env["NCCL_IB_GID_INDEX"] == "-1"
    assert env["NCCL_IB_MERGE_NICS"] == "1" and env["NCCL_IB_ADDR_FAMILY"] == "AF_INET"
    assert env["NCCL_IB_ROCE_VERSION_NUM"] == "2" and "NCCL_IB_DISABLE" not in env


def test_a_port_of_one_half_pins_its_gid_index_per_rank():
    env = env_of("spark1", "spark-b")
    assert env["NCCL_IB_HCA"] == "rocep1s0f0" and env["NCCL_IB_GID_INDEX"] == "5"
    assert "NCCL_IB_MERGE_NICS" not in env
    assert env_of("spark1", "spark-a")["NCCL_IB_GID_INDEX"] == "3"


def test_without_rdma_nccl_uses_sockets_and_no_gid():
    env = env_of("lab", "spark-b")
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_GID_INDEX" not in env and "NCCL_IB_HCA" not in env


def test_rdma_without_a_resolved_gid_is_refused():
    c = cluster("spark1")
    with pytest.raises(ValueError, match="spark-b: rdma_hca is rocep1s0f0 but no RoCE v2 GID index"):
        rendered_files(c, c.node("spark-b"), None)


def test_gpu_and_rdma_reach_docker_only_on_real_hardware():
    spark, lab = exec_words("spark", "spark-a"), exec_words("lab", "spark-a")
    assert "--gpus=all" in spark and "--device=/dev/infiniband" in spark and "--ulimit=memlock=-1" in spark
    assert "--gpus=all" not in lab and "--device=/dev/infiniband" not in lab


def test_drop_caches_is_in_the_unit_unless_data_says_no():
    [(spark_unit, _)] = [v for p, v in files_of("spark", "spark-a").items() if p.endswith(".service")]
    [(lab_unit, _)] = [v for p, v in files_of("lab", "spark-a").items() if p.endswith(".service")]
    assert "echo 3 > /proc/sys/vm/drop_caches" in spark_unit and "drop_caches" not in lab_unit


def test_forbidden_arguments_are_never_rendered(monkeypatch):
    c = cluster("spark")
    import sparkfleet.model.engine as engine

    for forbidden in FORBIDDEN_ARGS:
        monkeypatch.setitem(engine.ENGINES, "vllm", lambda p, cl, n, f=forbidden: ["vllm", "serve", "m", *f.split()])
        with pytest.raises(ValueError, match="hard-freeze"):
            engine_args(load_profile("glm-5.3-flash-exl3"), c, c.head)


def test_systemd_quoting_keeps_json_and_escapes_specifiers():
    assert systemd_quote('{"a":1}') == "'{\"a\":1}'"
    assert systemd_quote("50%") == "50%%" and systemd_quote("$HOME") == "'$$HOME'"
    assert systemd_quote("--port") == "--port"


def flag(words, name):
    return words[words.index(name) + 1]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_validates_and_pairs(profile):
    p = load_profile(profile)
    assert p.name == profile and p.tensor_parallel_size == 2
    assert p.image_ref.endswith(":" + p.recipe.commit)
    cluster("spark", profile)  # the pair's data accepts it (serving_problems: TP = node count)


@pytest.mark.parametrize("profile", VLLM_PROFILES)
@pytest.mark.parametrize("kind", ["spark", "lab"])
def test_vllm_workers_are_headless(kind, profile):
    head = engine_words(exec_words(kind, "spark-a", profile), profile)
    worker = engine_words(exec_words(kind, "spark-b", profile), profile)
    assert head[:2] == worker[:2] == ["vllm", "serve"]
    assert "--headless" not in head and "--headless" in worker
    for words, rank in ((head, "0"), (worker, "1")):
        assert flag(words, "--node-rank") == rank and flag(words, "--master-addr") == "10.77.77.1"
        assert "--dist-init-addr" not in words


@pytest.mark.parametrize("profile", SGLANG_PROFILES)
@pytest.mark.parametrize("kind", ["spark", "lab"])
def test_sglang_every_rank_runs_the_same_command_joined_at_the_head(kind, profile):
    p = load_profile(profile)
    head = engine_words(exec_words(kind, "spark-a", profile), profile)
    worker = engine_words(exec_words(kind, "spark-b", profile), profile)
    for words, rank in ((head, "0"), (worker, "1")):
        assert words[:3] == ["python3", "-m", "sglang.launch_server"]
        assert "--headless" not in words  # SGLang has none: every rank runs launch_server
        assert flag(words, "--dist-init-addr") == f"10.77.77.1:{p.master_port}"
        assert flag(words, "--nnodes") == "2" and flag(words, "--node-rank") == rank
        assert flag(words, "--tp-size") == "2" and flag(words, "--model-path") == f"/models/{p.model}"
        # vLLM's names never reach SGLang (it would refuse them).
        for vllm_only in ("--master-addr", "--master-port", "--distributed-executor-backend",
                          "--tensor-parallel-size", "--enable-auto-tool-choice", "--speculative-config",
                          "--gpu-memory-utilization", "--max-model-len", "--limit-mm-per-prompt"):
            assert vllm_only not in words
    # Only rank 0 serves HTTP; apart from that the ranks' commands are the same.
    # Only rank 0 serves HTTP, on loopback behind the API proxy (roles/api_proxy); else the same commands.
    assert flag(head, "--host") == "127.0.0.1" and flag(head, "--port") == "18000" != str(p.port)
    assert "--port" not in worker and "--host" not in worker
    assert without(head, "--node-rank", "--host", "--port") == without(worker, "--node-rank")
    # No key for SGLang (it reads --api-key alone, and --config files): the API proxy checks it.
    assert "--api-key" not in head and "--config" not in head


def without(words, *flags):
    """words without each flag and its value."""
    words = list(words)
    for name in flags:
        i = words.index(name)
        del words[i:i + 2]
    return words


@pytest.mark.parametrize("profile", SGLANG_PROFILES)
def test_sglang_rank_env_is_the_same_shape_as_vllm(profile):
    env = env_of("spark", "spark-b", profile)
    assert "VLLM_HOST_IP" not in env  # vLLM's variable; SGLang binds by --dist-init-addr
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0"
    assert env["NCCL_IB_GID_INDEX"] == "-1" and env["NCCL_IB_HCA"] == "=rocep1s0f0,roceP2p1s0f0"
    assert env_of("spark1", "spark-b", profile)["NCCL_IB_GID_INDEX"] == "5"


def test_qwen_profile_is_the_report_card():
    words = engine_words(exec_words("spark", "spark-a", "qwen3.8-flash-next"), "qwen3.8-flash-next")
    assert [flag(words, f) for f in ("--speculative-algorithm", "--speculative-num-steps",
                                     "--speculative-eagle-topk", "--speculative-num-draft-tokens")] == \
        ["NEXTN", "3", "1", "4"]
    assert "--speculative-draft-model-path" not in words  # NEXTN drafts with the model's own layer
    assert flag(words, "--context-length") == "1048576"
    assert "--enable-multimodal" in words and "--language-model-only" not in words  # vision on
    assert "NVFP4" in flag(words, "--model-path")


def test_deepseek_profile_is_the_report_card():
    words = engine_words(exec_words("spark", "spark-a", "deepseek-v4-flash"), "deepseek-v4-flash")
    assert json.loads(flag(words, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 2}
    assert flag(words, "--max-model-len") == "1048576" and flag(words, "--tensor-parallel-size") == "2"
    assert json.loads(flag(words, "--limit-mm-per-prompt")) == {"image": 0, "video": 0}  # vision off
    assert "--tool-call-parser" not in words and "--reasoning-parser" not in words  # not in the report
    assert float(flag(words, "--gpu-memory-utilization")) < 0.84  # 0.84 failed the free-memory check
    assert words[:2] == ["vllm", "serve"] and "NVFP4" in words[2]


@pytest.mark.parametrize("kind", ["spark", "lab"])
@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_mtp_variant_is_the_dflash_card_without_the_drafter(kind, name):
    dflash, mtp = load_profile("glm-5.3-flash-exl3"), load_profile("glm-5.3-flash-exl3-mtp")
    assert mtp.speculative.draft_model is None and mtp.speculative.draft_license is None
    assert mtp.image_ref == dflash.image_ref  # one image serves both
    a, b = exec_words(kind, name), exec_words(kind, name, "glm-5.3-flash-exl3-mtp")
    spec = json.loads(flag(b, "--speculative-config"))
    assert spec == {"method": "mtp", "num_speculative_tokens": 1}  # no model, no draft TP
    assert not any("DFlash" in w or "dflash" in w for w in b)
    assert without(a, "--speculative-config") == without(b, "--speculative-config")  # all else the same
    env_a, env_b = env_of(kind, name), env_of(kind, name, "glm-5.3-flash-exl3-mtp")
    assert "DFLASH_DRAFT_TP" not in env_b
    drafter_only = ("DFLASH_DRAFT_TP",)
    assert {k: v for k, v in env_a.items() if k not in drafter_only} == env_b


@pytest.mark.parametrize("profile", PROFILES)
def test_no_profile_renders_a_forbidden_argument(profile):
    c = cluster("spark", profile)
    for node in c.nodes:
        joined = " ".join(engine_args(load_profile(profile), c, node))
        assert not any(f in joined for f in FORBIDDEN_ARGS)
