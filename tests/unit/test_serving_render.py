"""Rendered units and environment files of the shipped profile, on both ranks, for real-hardware
data (GPU, RDMA with a per-rank GID index) and for lab data; plus the engine command's rules."""
import json
import shlex

import pytest

from roles.serving.checks import rendered_files
from roles.serving.engine import FORBIDDEN_ARGS, engine_args, systemd_quote
from roles.serving.schema import load_profile
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair
from tests.unit.test_templates import check_golden

LAB = {
    "netplan_renderer": "networkd", "rdma_hca": None, "gpu_expected": False, "serving_drop_caches": False,
    "serving_recipe_repository": "git://198.18.0.1/recipe.git",
    "serving_recipe_commit": "b12b30420b6ba57d6e76e28159d226091a3b6d10", "serving_ulimit_memlock": "8388608",
}
# Per-rank RoCE v2 GID indexes as recorded on two Sparks: they differ per node.
GIDS = {"spark-a": 3, "spark-b": 5}


def cluster(kind):
    return build_cluster(pair()) if kind == "spark" else build_cluster(pair(**{"spark-a": LAB, "spark-b": LAB}))


def files_of(kind, name):
    c = cluster(kind)
    node = c.node(name)
    return rendered_files(c, node, GIDS[name] if node.rdma_hca else None)


@pytest.mark.parametrize("kind", ["spark", "lab"])
@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_units_and_env_match_golden(kind, name):
    for path, (text, _mode) in files_of(kind, name).items():
        check_golden(f"{kind}-{name}-{path.rsplit('/', 1)[1]}", text)


def env_of(kind, name) -> dict:
    [(text, mode)] = [v for p, v in files_of(kind, name).items() if p.endswith(".env")]
    assert mode == "0600"
    return dict(l.split("=", 1) for l in text.splitlines() if l and not l.startswith("#"))


def exec_words(kind, name) -> list[str]:
    [(text, _)] = [v for p, v in files_of(kind, name).items() if p.endswith(".service")]
    start = text.split("ExecStart=", 1)[1].split("\nExecStop=", 1)[0].replace("\\\n", " ")
    return shlex.split(start.replace("%%", "%").replace("$$", "$"))


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
        "method": "dflash2", "num_speculative_tokens": 7, "model": "incoai/GLM-5.3-Flash-DFlash2",
        "draft_tensor_parallel_size": 2}
    assert "--limit-mm-per-prompt" not in words  # vision on
    profile = load_profile("glm-5.3-flash-exl3")
    assert profile.recipe.commit == "493cb88"


def test_rank_env_pins_the_profile_and_the_rank():
    env = env_of("spark", "spark-b")
    assert env["CG_ESTIMATE"] == "0" and env["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] == "0"
    assert env["VLLM_HOST_IP"] == "10.77.77.2" and env["MASTER_ADDR"] == "10.77.77.1"
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        assert env[key] == "enp1s0f0np0"
    assert env["NCCL_IB_HCA"] == "rocep1s0f0" and env["NCCL_IB_GID_INDEX"] == "5"
    assert "NCCL_IB_DISABLE" not in env
    assert env_of("spark", "spark-a")["NCCL_IB_GID_INDEX"] == "3"


def test_without_rdma_nccl_uses_sockets_and_no_gid():
    env = env_of("lab", "spark-b")
    assert env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_GID_INDEX" not in env and "NCCL_IB_HCA" not in env


def test_rdma_without_a_resolved_gid_is_refused():
    c = cluster("spark")
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
    import roles.serving.engine as engine

    for forbidden in FORBIDDEN_ARGS:
        monkeypatch.setitem(engine.ENGINES, "vllm", lambda p, cl, n, f=forbidden: ["vllm", "serve", "m", *f.split()])
        with pytest.raises(ValueError, match="hard-freeze"):
            engine_args(load_profile("glm-5.3-flash-exl3"), c, c.head)


def test_systemd_quoting_keeps_json_and_escapes_specifiers():
    assert systemd_quote('{"a":1}') == "'{\"a\":1}'"
    assert systemd_quote("50%") == "50%%" and systemd_quote("$HOME") == "'$$HOME'"
    assert systemd_quote("--port") == "--port"
