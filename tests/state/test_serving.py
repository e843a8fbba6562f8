"""The serving pair as the inventory and its profile declare it, checked on the machines."""
import json
import shlex

import pytest

from roles.serving.api_key import RETIRED_FILES, authed_curl, key_file
from tests.state.limits import request_bound_s
from roles.image.checks import pin_of
from sparkfleet.model.tls import api_base, curl_tls
from sparkfleet.model.engine import KEY_CURL_FILE, KEY_PROXY_FILE, env_file_path, image_pin_path, unit_name


def test_the_rank_unit_is_active_and_the_other_is_absent(host, node):
    mine = host.service(unit_name(node))
    assert mine.is_running, f"{node.name}: {unit_name(node)} is not active"
    assert mine.is_enabled == node.serving_start_at_boot, f"{node.name}: {unit_name(node)} enabled={mine.is_enabled}"
    other = "sparkfleet-worker" if node.is_head else "sparkfleet-head"
    assert not host.file(f"/etc/systemd/system/{other}.service").exists, f"{node.name}: {other} unit present"


def test_the_rank_container_runs_the_profile_image(host, node, cluster, node_hosts, profile):
    """The head runs its build by tag; a worker the digest the head pushed, named by its pin file,
    which is one of the head's own registry digests of that image: the same image ID everywhere."""
    fmt = "{{.State.Status}} {{.Config.Image}} {{.Image}}"
    out = host.run(f"docker inspect --format '{fmt}' {unit_name(node)}")
    assert out.rc == 0, f"{node.name}: no container {unit_name(node)}: {out.stderr}"
    status, image, image_id = out.stdout.split()
    assert status == "running", f"{node.name}: {out.stdout.strip()}"
    assert image_id == host.check_output(f"docker image inspect --format '{{{{.Id}}}}' {profile.image_ref}")
    if node.is_head:
        assert image == profile.image_ref, f"{node.name}: {out.stdout.strip()}"
        return
    pin = pin_of(host.file(image_pin_path(node)).content_string)
    assert image == pin, f"{node.name}: runs {image}, its pin file {image_pin_path(node)} names {pin}"
    head = node_hosts[cluster.head.name]
    digests = json.loads(head.check_output(f"docker image inspect --format '{{{{json .RepoDigests}}}}' {profile.image_ref}"))
    assert pin in digests, f"{node.name}: pinned to {pin}, not a digest the head pushed ({digests})"


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
    if len(node.rdma_hcas) > 1:  # both halves: NCCL chooses each HCA's GID (the unit checks it at start)
        assert env["NCCL_IB_HCA"] == "=" + ",".join(node.rdma_hcas) and env["NCCL_IB_GID_INDEX"] == "-1", env
    elif node.rdma_hca:
        assert env["NCCL_IB_HCA"] == node.rdma_hca and env["NCCL_IB_GID_INDEX"].isdigit()
    else:
        assert env["NCCL_IB_DISABLE"] == "1"


def test_every_node_has_the_same_image_id(node, cluster, node_hosts, profile):
    ids = {}
    for name, peer in node_hosts.items():
        ids[name] = peer.check_output(f"docker image inspect --format '{{{{.Id}}}}' {profile.image_ref}")
    assert len(set(ids.values())) == 1, f"image {profile.image_ref} differs: {ids}"


def test_the_head_recorded_the_recipe_base_images_by_digest(host, node, profile):
    if not node.is_head:
        pytest.skip("the head builds the image")
    from roles.image.checks import base_record_path

    record = host.file(base_record_path(node, profile))
    assert record.exists, f"{node.name}: no base-image record {record.path} for {profile.image_ref}"
    entries = [line.split("\t") for line in record.content_string.splitlines() if line and not line.startswith("#")]
    assert entries, f"{node.name}: {record.path} lists no base image"
    for ref, digest, image_id in entries:
        assert digest == "-" or "@sha256:" in digest, f"{node.name}: {ref}: {digest!r} is not a registry digest"
        assert image_id.startswith("sha256:"), f"{node.name}: {ref}: image ID {image_id!r}"
        local = host.run(f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(ref)}")
        assert local.rc == 0 and local.stdout.strip() == image_id, (
            f"{node.name}: base image {ref} is now {local.stdout.strip() or 'absent'}, the build used {image_id}")


def test_the_head_serves_the_profile_model(host, node, profile):
    if not node.is_head:
        pytest.skip("the API is on the head")
    out = host.run(f"{authed_curl(node, curl_tls(node))} -fsS -m 10 {api_base(node, profile.port)}/v1/models")
    assert out.rc == 0, f"{node.name}: /v1/models with the API key failed: {out.stderr}"
    models = [m["id"] for m in json.loads(out.stdout)["data"]]
    assert models == [profile.api_model_name], f"{node.name}: serves {models}"


def test_the_api_refuses_a_request_without_the_key_and_serves_one_with_it(host, node, profile):
    if not node.is_head:
        pytest.skip("the API is on the head")
    url = f"{api_base(node, profile.port)}/v1/chat/completions"
    body = json.dumps({"model": profile.api_model_name, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Say hello in one word."}]})
    post = (f"{curl_tls(node)} -sS -m {request_bound_s(node)} -o /dev/null -w '%{{http_code}}' "
            f"-H 'Content-Type: application/json' --data-binary @- {url}")
    without = host.run(f"printf '%s' {shlex.quote(body)} | curl {post}").stdout.strip()
    wrong = host.run(f"printf '%s' {shlex.quote(body)} | curl -H 'Authorization: Bearer not-the-key' {post}").stdout.strip()
    with_key = host.run(f"printf '%s' {shlex.quote(body)} | {authed_curl(node)} {post}").stdout.strip()
    assert (without, wrong, with_key) == ("401", "401", "200"), (
        f"{node.name}: chat completions answered {without} without the key, {wrong} with a wrong one and "
        f"{with_key} with it; want 401, 401, 200")


def test_the_api_key_files_are_root_only_and_the_key_is_on_no_command_line(host, node, profile):
    if not node.is_head:
        pytest.skip("the key is on the head")
    paths = [key_file(node)] + [f"{node.serving_dir}/{f}" for f in (KEY_CURL_FILE, KEY_PROXY_FILE)]
    for path in paths:
        f = host.file(path)
        assert f.exists and f.user == "root" and f.mode == 0o600, f"{node.name}: {path} missing or not root-only"
    for name in RETIRED_FILES:  # the engine's own copies of the key, which it no longer gets
        path = f"{node.serving_dir}/{name}"
        assert path == key_file(node) or not host.file(path).exists, f"{node.name}: {path} is still there"
    key = host.file(key_file(node)).content_string.strip()
    assert len(key) >= 16
    unit = host.file(f"/etc/systemd/system/{unit_name(node)}.service").content_string
    cmdline = host.check_output(f"docker inspect --format '{{{{json .Config.Cmd}}}} {{{{json .Path}}}} "
                                f"{{{{json .Args}}}}' {unit_name(node)}")
    processes = host.check_output("ps -eo args")
    journal = host.check_output(f"journalctl -u {unit_name(node)} --no-pager -o cat | tail -n 5000")
    for what, text in (("the unit", unit), ("docker inspect's command line", cmdline),
                       ("a process's argv", processes), ("the unit's log", journal)):
        assert key not in text, f"{node.name}: the API key is in {what}"


# Linux's capability numbers (include/uapi/linux/capability.h) of the ones a profile may give back.
CAPABILITY_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7,
                   "SETPCAP": 8, "NET_BIND_SERVICE": 10, "NET_RAW": 13, "SYS_CHROOT": 18, "SYS_NICE": 23, "MKNOD": 27,
                   "AUDIT_WRITE": 29, "SETFCAP": 31}


def test_the_engine_runs_with_no_capability_no_new_privileges_and_no_api_key(host, node, profile):
    """Issue 43 item 7, on the running container: Docker dropped every capability but the profile's
    container.cap_add (none shipped) and set no-new-privileges, and every process of the engine shows
    it (/proc/<pid>/status, as the kernel holds it); the container has no API key in its environment,
    its mounts or its command; the head's engine answers its own port without one (root on the head;
    the API proxy in front of it is what checks the key)."""
    unit = unit_name(node)
    drop, add, security, privileged, env, mounts, cmd = (
        json.loads(host.check_output(f"docker inspect --format '{{{{json {field}}}}}' {unit}"))
        for field in (".HostConfig.CapDrop", ".HostConfig.CapAdd", ".HostConfig.SecurityOpt", ".HostConfig.Privileged",
                      ".Config.Env", ".Mounts", ".Config.Cmd"))
    granted = list(profile.container.cap_add)
    assert drop == ["ALL"] and (add or []) == granted and privileged is False, (node.name, drop, add, privileged)
    assert "no-new-privileges" in (security or []), (node.name, security)
    mask = sum(1 << CAPABILITY_BITS[c] for c in granted)
    pids = host.check_output(f"docker top {unit} -eo pid").split()[1:]
    assert pids, f"{node.name}: no process in {unit}"
    for pid in pids:
        status = dict(line.split(":", 1) for line in host.check_output(f"cat /proc/{pid}/status").splitlines() if ":" in line)
        caps = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
        assert caps["CapBnd"] == mask and caps["CapEff"] == caps["CapPrm"] == mask and caps["CapAmb"] == 0, (node.name, pid, caps)
        assert status["NoNewPrivs"].strip() == "1", (node.name, pid, status["NoNewPrivs"])
    assert not [e for e in env if e.startswith("VLLM_API_KEY=")], f"{node.name}: the engine's environment has a key"
    assert not [m for m in mounts if "api-key" in m.get("Source", "")], (node.name, mounts)
    assert not [w for w in cmd if w in ("--api-key", "--config") or w.startswith("--api-key=")], (node.name, cmd)
    if node.is_head:
        code = host.check_output(f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' "
                                 f"http://127.0.0.1:{node.api_proxy_engine_port}/v1/models")
        assert code == "200", f"{node.name}: the engine's own /v1/models answered {code} without a key"


def plain_ipv4(endpoint: str) -> str:
    """`[::ffff:a.b.c.d]:port` as `a.b.c.d:port`; any other endpoint as it is."""
    address, _, port = endpoint.rpartition(":")
    if address.startswith("[::ffff:") and address.endswith("]") and "." in address:
        return f"{address[8:-1]}:{port}"
    return endpoint


def test_the_worker_reaches_the_head_over_the_fabric(host, node, cluster, profile):
    if node.is_head:
        pytest.skip("workers dial the head")
    lines = host.check_output(f"ss -tnH state established '( dport = :{profile.master_port} )'").splitlines()
    # An IPv4 address on a dual-stack socket is shown IPv4-mapped ([::ffff:198.19.77.2]:44940), as the
    # real vLLM's rendezvous (torch's TCPStore) connects; the stand-ins' sockets are plain IPv4.
    pairs = [(plain_ipv4(l.split()[-2]), plain_ipv4(l.split()[-1])) for l in lines if l.strip()]
    want = (f"{node.fabric_ip}", f"{cluster.head.fabric_ip}:{profile.master_port}")
    assert any(local.rsplit(":", 1)[0] == want[0] and peer == want[1] for local, peer in pairs), (
        f"{node.name}: no connection {want[0]} -> {want[1]} (found {pairs})")
