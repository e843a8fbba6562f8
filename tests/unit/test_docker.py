"""The Docker daemon config sparkfleet writes, and the check of what `docker info` reports.

docker-info-lab.json is captured from a lab host after a deploy; the GPU variant adds what the
NVIDIA container toolkit registers (runtime "nvidia", made the default by daemon.json). No JSON
`docker info` of a DGX Spark is public; a Spark's runtimes are known from the text `docker info`
prints (captures/docker_info_runtimes_text.txt), whose two lines are the JSON's fields.
"""
import copy
import json
from pathlib import Path

from roles.docker.checks import daemon_config, docker_info_problems
from sparkfleet.model.docker import registry_address
from sparkfleet.config import build_cluster
from tests.unit.capture_views import command_output
from tests.unit.helpers import capture, pair

LAB_INFO = json.loads((Path(__file__).parent / "fixtures/docker-info-lab.json").read_text())
LAB = {"netplan_renderer": "networkd", "rdma_hca": None, "rdma_twin_hca": None, "gpu_expected": False}


def lab_cluster():
    c = build_cluster(pair(**{"spark-a": LAB, "spark-b": LAB}))
    return c


def lab_info_for(cluster):
    """The captured info, re-keyed to this cluster's registry address."""
    info = copy.deepcopy(LAB_INFO)
    [entry] = [v for k, v in info["RegistryConfig"]["IndexConfigs"].items() if k != "docker.io"]
    entry["Name"] = registry_address(cluster)
    info["RegistryConfig"]["IndexConfigs"] = {entry["Name"]: entry}
    return info


def gpu_info(cluster):
    info = lab_info_for(cluster)
    info["Runtimes"]["nvidia"] = {"path": "nvidia-container-runtime"}
    info["DefaultRuntime"] = "nvidia"
    return info


def test_daemon_config_rotates_logs_and_trusts_only_the_fabric_registry():
    c = lab_cluster()
    cfg = daemon_config(c.node("spark-b"), c)
    assert cfg["log-driver"] == "json-file" and cfg["log-opts"] == {"max-size": "100m", "max-file": "5"}
    assert cfg["insecure-registries"] == ["10.77.77.1:5000"] and cfg["live-restore"] is True
    assert "default-runtime" not in cfg


def test_gpu_nodes_get_the_nvidia_runtime_as_default():
    c = build_cluster(pair())
    cfg = daemon_config(c.head, c)
    assert cfg["default-runtime"] == "nvidia" and cfg["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"


def test_the_captured_lab_info_passes():
    c = lab_cluster()
    assert docker_info_problems(c.node("spark-b"), c, lab_info_for(c)) == []


def test_a_missing_registry_or_rotation_is_reported():
    c = lab_cluster()
    info = lab_info_for(c)
    info["RegistryConfig"]["IndexConfigs"] = {}
    info["LoggingDriver"] = "journald"
    problems = docker_info_problems(c.head, c, info)
    assert any("10.77.77.1:5000" in p for p in problems) and any("journald" in p for p in problems)


def test_gpu_node_without_the_nvidia_runtime_fails_and_with_it_passes():
    c = build_cluster(pair())
    assert docker_info_problems(c.head, c, gpu_info(c)) == []
    problems = docker_info_problems(c.head, c, lab_info_for(c))
    assert any("no nvidia runtime" in p for p in problems) and any("default runtime runc" in p for p in problems)


def spark_runtimes() -> dict:
    """The runtimes of a Spark from its text `docker info`: " Runtimes:" lists the keys of the JSON's
    Runtimes map and " Default Runtime:" is its DefaultRuntime (docker/cli cli/command/system/info.go,
    prettyPrintServerInfo)."""
    lines = command_output(capture("docker_info_runtimes_text.txt"), "docker info 2>/dev/null | grep -i runtime")
    fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)}
    return {"Runtimes": {name: {} for name in fields["Runtimes"].split()}, "DefaultRuntime": fields["Default Runtime"]}


def test_a_spark_with_the_nvidia_runtime_registered_but_runc_as_default_is_named_for_the_default_only():
    """The Spark of that capture (Docker with the NVIDIA toolkit, driver 580.142) lists io.containerd.runc.v2,
    nvidia and runc, runc the default: what the check after daemon.json's restart refuses, naming the default."""
    c = build_cluster(pair())
    runtimes = spark_runtimes()
    assert set(runtimes["Runtimes"]) == {"io.containerd.runc.v2", "nvidia", "runc"}
    assert docker_info_problems(c.head, c, {**lab_info_for(c), **runtimes}) == [
        "spark-a: docker default runtime runc, want nvidia"]
    assert docker_info_problems(c.head, c, {**lab_info_for(c), **runtimes, "DefaultRuntime": "nvidia"}) == []


def test_no_info_means_the_engine_is_down():
    c = lab_cluster()
    assert docker_info_problems(c.head, c, None) == ["spark-a: docker info failed (is the engine running?)"]


def test_differing_image_ids_are_named_per_node():
    from roles.image.checks import ids_differ_message

    msg = ids_differ_message({"spark-a": "sha256:" + "a" * 64, "spark-b": None}, "img:abc1234")
    assert msg.startswith("image img:abc1234 differs between nodes: spark-a=sha256:aaaaaaaaaaaa, spark-b=missing")
