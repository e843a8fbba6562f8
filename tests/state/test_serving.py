"""The serving pair as the inventory and its profile declare it, checked on the machines."""
import json

import pytest

from roles.serving.engine import env_file_path, unit_name


def test_the_rank_unit_is_active_and_the_other_is_absent(host, node):
    mine = host.service(unit_name(node))
    assert mine.is_running, f"{node.name}: {unit_name(node)} is not active"
    assert mine.is_enabled == node.serving_start_at_boot, f"{node.name}: {unit_name(node)} enabled={mine.is_enabled}"
    other = "sparkfleet-worker" if node.is_head else "sparkfleet-head"
    assert not host.file(f"/etc/systemd/system/{other}.service").exists, f"{node.name}: {other} unit present"


def test_the_rank_container_runs_the_profile_image(host, node, profile):
    fmt = "{{.State.Status}} {{.Config.Image}}"
    out = host.run(f"docker inspect --format '{fmt}' {unit_name(node)}")
    assert out.rc == 0, f"{node.name}: no container {unit_name(node)}: {out.stderr}"
    assert out.stdout.split() == ["running", profile.image_ref], f"{node.name}: {out.stdout.strip()}"


def test_the_environment_file_is_root_only_and_holds_every_pinned_value(host, node, cluster, profile):
    env_file = host.file(env_file_path(node, node.serving_dir))
    assert env_file.exists and env_file.user == "root" and env_file.mode == 0o600, (
        f"{node.name}: {env_file.path} missing or not root-only (mode {env_file.mode:o})")
    env = dict(l.split("=", 1) for l in env_file.content_string.splitlines() if l and not l.startswith("#"))
    pinned = {**profile.env, **profile.launcher_env}
    missing = {k: v for k, v in pinned.items() if env.get(k) != v}
    assert not missing, f"{node.name}: pinned values missing or changed: {missing}"
    if profile.engine == "vllm":
        assert env["VLLM_HOST_IP"] == node.fabric_ip, f"{node.name}: VLLM_HOST_IP={env.get('VLLM_HOST_IP')}"
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        assert env[key] == node.fabric_netdev, f"{node.name}: {key}={env.get(key)}"
    if node.rdma_hca:
        assert env["NCCL_IB_HCA"] == node.rdma_hca and env["NCCL_IB_GID_INDEX"].isdigit()
    else:
        assert env["NCCL_IB_DISABLE"] == "1"


def test_every_node_has_the_same_image_id(node, cluster, node_hosts, profile):
    ids = {}
    for name, peer in node_hosts.items():
        ids[name] = peer.check_output(f"docker image inspect --format '{{{{.Id}}}}' {profile.image_ref}")
    assert len(set(ids.values())) == 1, f"image {profile.image_ref} differs: {ids}"


def test_the_head_serves_the_profile_model(host, node, profile):
    if not node.is_head:
        pytest.skip("the API is on the head")
    out = host.run(f"curl -fsS -m 10 http://127.0.0.1:{profile.port}/v1/models")
    assert out.rc == 0, f"{node.name}: /v1/models failed: {out.stderr}"
    models = [m["id"] for m in json.loads(out.stdout)["data"]]
    assert models == [profile.api_model_name], f"{node.name}: serves {models}"


def test_the_worker_reaches_the_head_over_the_fabric(host, node, cluster, profile):
    if node.is_head:
        pytest.skip("workers dial the head")
    lines = host.check_output(f"ss -tnH state established '( dport = :{profile.master_port} )'").splitlines()
    pairs = [(l.split()[-2], l.split()[-1]) for l in lines if l.strip()]
    want = (f"{node.fabric_ip}", f"{cluster.head.fabric_ip}:{profile.master_port}")
    assert any(local.rsplit(":", 1)[0] == want[0] and peer == want[1] for local, peer in pairs), (
        f"{node.name}: no connection {want[0]} -> {want[1]} (found {pairs})")
