"""The engine gets what it needs and no more (issue 43 item 7): every rank's rendered unit runs its
container with every capability dropped and no-new-privileges, gives the head's engine no API key
(the API proxy checks it), and gives back a capability only where a profile names one of the few it
may; anything broader is refused when the profile loads, naming the hosts, the key and the values."""
from pathlib import Path

import pytest
import yaml

import sparkfleet.model.serving as schema
from roles.serving.checks import rendered_files, unit_path
from sparkfleet.config import ConfigError, build_cluster
from sparkfleet.model.engine import ENGINE_SECURITY_ARGS, env_file_path, served_image
from sparkfleet.model.serving import ENGINE_CAPABILITIES, node_profile
from tests.unit.helpers import pair
from tests.unit.test_kernel_cache import exec_start_words
from tests.unit.test_serving_render import GIDS, PROFILES, cluster

# Docker's default capability set (moby/moby oci/caps/defaults.go DefaultCapabilities), without CAP_.
DOCKER_DEFAULT = {"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID", "SETFCAP",
                  "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}


def unit_of(c, name):
    node = c.node(name)
    text, _mode = rendered_files(c, node, GIDS[name] if node.rdma_hca else None)[unit_path(node)]
    return node, text


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", ["spark", "lab"])
@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_every_rank_runs_with_no_capability_no_new_privileges_and_no_api_key(kind, name, profile):
    c = cluster(kind, profile)
    node, text = unit_of(c, name)
    words = exec_start_words(text)
    options = words[:words.index(served_image(node_profile(node), node))]  # docker's, before the image
    assert options.count("--cap-drop=ALL") == 1 and options.count("--security-opt=no-new-privileges") == 1, options
    assert not [w for w in options if w.startswith(("--cap-add", "--privileged", "--security-opt=seccomp",
                                                    "--security-opt=apparmor", "--user", "--userns"))], options
    # No key: not in an env file beside the rank's own, not mounted, not on the command line.
    assert [w for w in options if w.startswith("--env-file=")] == [f"--env-file={env_file_path(node, node.serving_dir)}"]
    assert not [w for w in words if "api-key" in w or "VLLM_API_KEY" in w or w in ("--api-key", "--config")], words
    # The unit says why, where a reader of the node's unit looks.
    assert "--cap-drop=ALL; it uses none of Docker's" in text and "ENGINE_SECURITY_ARGS" in text
    assert ("no API key (the API proxy in front of it checks the key)" in text) == node.is_head
    assert "Given back" not in text


def test_the_rendered_options_are_the_model_s():
    assert ENGINE_SECURITY_ARGS == ["--cap-drop=ALL", "--security-opt=no-new-privileges"]
    # What a profile may give back: Docker's own default set (what the engine had before they were
    # dropped) and SYS_NICE, which both engines name for NUMA binding; nothing broader.
    assert set(ENGINE_CAPABILITIES) == DOCKER_DEFAULT | {"SYS_NICE"}


def changed_profile(tmp_path, monkeypatch, **changes):
    """glm-5.3-flash-exl3 with `changes` (container.<key> for a dotted name), loaded as profile 'changed'."""
    data = yaml.safe_load((schema.PROFILES_DIR / "glm-5.3-flash-exl3.yaml").read_text())
    for key, value in changes.items():
        where, _, field = key.rpartition(".")
        (data[where] if where else data)[field] = value
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", Path(tmp_path))
    return {"serving_profile": "changed"}


def test_a_profile_gives_back_only_what_it_names_and_the_unit_says_so(tmp_path, monkeypatch):
    data = changed_profile(tmp_path, monkeypatch, **{"container.cap_add": ["CHOWN", "SYS_NICE"]})
    c = build_cluster(pair(**{"spark-a": data, "spark-b": data}))
    assert node_profile(c.head).container.cap_add == ("CHOWN", "SYS_NICE")
    for name in ("spark-a", "spark-b"):
        _node, text = unit_of(c, name)
        words = exec_start_words(text)
        drop = words.index("--cap-drop=ALL")
        assert words[drop:drop + 4] == ["--cap-drop=ALL", "--cap-add=CHOWN", "--cap-add=SYS_NICE",
                                        "--security-opt=no-new-privileges"], words
        assert "# Given back, by profile glm-5.3-flash-exl3's container.cap_add (its image's entrypoint needs them): CHOWN, SYS_NICE." in text


@pytest.mark.parametrize("changes, shown", [
    ({"container.cap_add": ["SYS_ADMIN"]}, "container.cap_add.0 = 'SYS_ADMIN': Input should be 'AUDIT_WRITE', 'CHOWN',"),
    ({"container.cap_add": ["ALL"]}, "container.cap_add.0 = 'ALL': Input should be"),
    ({"container.cap_add": ["cap_chown"]}, "container.cap_add.0 = 'cap_chown': Input should be"),
    # The rendezvous the engine binds: below 1024 it would need CAP_NET_BIND_SERVICE, which it has not.
    ({"master_port": 500}, "master_port = 500: Input should be greater than or equal to 1024"),
])
def test_a_capability_beyond_the_allowed_or_a_privileged_port_is_refused_naming_hosts_key_and_values(
        tmp_path, monkeypatch, changes, shown):
    data = changed_profile(tmp_path, monkeypatch, **changes)
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{"spark-a": data, "spark-b": data}))
    text = str(err.value)
    assert "spark-a, spark-b: key 'serving_profile' = 'changed': profile 'changed'" in text and shown in text, text
    if "cap_add" in shown:
        assert "'SYS_CHROOT' or 'SYS_NICE'" in text  # every allowed value named
