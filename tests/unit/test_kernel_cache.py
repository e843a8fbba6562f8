"""roles/kernel_cache: generations, retention, manifest comparison, the prewarm command and warm-up set."""
import json
import shlex

import pytest

from roles.kernel_cache.checks import (
    expired, generation, manifest_differences, missing_entries, prewarm_command, request_command,
)
from roles.kernel_cache.schema import CACHE_VARS
from roles.kernel_cache.warmup import png_data_url, warmup_requests
from roles.serving.engine import rank_env
from roles.serving.schema import load_profile
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair


def manifest(*entries):
    return "# sparkfleet kernel cache manifest v1\n" + "".join(f"{sha}\t{size}\t{path}\n" for path, size, sha in entries)


def test_a_generation_is_named_by_the_image_id():
    assert generation("sha256:0123456789abcdef0123") == "0123456789ab"
    assert generation(None) is None


def test_retention_keeps_the_current_generation_and_the_newest_others():
    gens = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    assert expired(gens, keep=2, current="a") == ["b", "c"]  # a (current) and d (newest other) stay
    assert expired(gens, keep=1, current="d") == ["a", "b", "c"]
    assert expired(gens, keep=4, current="a") == []
    assert expired(gens, keep=2, current=None) == ["a", "b"]  # not linked yet: the two newest stay


def test_missing_entries_name_deleted_and_resized_files_and_ignore_extras():
    text = manifest(("triton/ab/x.json", 4096, "s1"), ("vllm/y.json", 10, "s2"))
    assert missing_entries(text, {"triton/ab/x.json": 4096, "vllm/y.json": 10, "new": 1}) == []
    assert missing_entries(text, {"vllm/y.json": 11}) == ["triton/ab/x.json", "vllm/y.json"]
    assert missing_entries(None, {}) == []


def test_manifest_differences_say_what_a_rank_lacks_and_what_only_it_has():
    head = manifest(("a", 1, "s"), ("b", 1, "s"))
    worker = manifest(("a", 1, "other"), ("c", 1, "s"))
    assert manifest_differences(head, worker) == (["a", "b"], ["c"])
    assert manifest_differences(head, head) == ([], [])


def cluster(**data):
    return build_cluster(pair(**{"spark-a": data, "spark-b": data}))


def test_the_prewarm_container_is_the_production_command_detached_with_its_own_name_and_env():
    c = cluster()
    profile = load_profile("glm-5.3-flash-exl3")
    words = shlex.split(prewarm_command(profile, c, c.node("spark-b")))
    assert words[:3] == ["/usr/bin/docker", "run", "--detach"]
    assert words[words.index("--name") + 1] == "sparkfleet-prewarm"
    assert "--env-file=/etc/sparkfleet/sparkfleet-worker.prewarm.env" in words
    assert "--volume=/var/lib/sparkfleet/kernel-cache/current:/var/cache/sparkfleet" in words
    assert "--headless" in words and words[words.index("--node-rank") + 1] == "1"


def test_every_cache_variable_points_into_the_mounted_generation():
    c = cluster()
    env = rank_env(load_profile("glm-5.3-flash-exl3"), c, c.node("spark-a"), 3)
    assert {v: env[v] for v in CACHE_VARS} == {v: f"/var/cache/sparkfleet/{sub}" for v, sub in CACHE_VARS.items()}
    assert set(CACHE_VARS) == {"TILELANG_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT",
                               "FLASHINFER_WORKSPACE_BASE", "TORCHINDUCTOR_CACHE_DIR"}


@pytest.mark.parametrize("name,vision", [("glm-5.3-flash-exl3", True), ("deepseek-v4-flash", False)])
def test_the_warm_up_set_covers_short_long_tools_and_images_when_vision_is_on(name, vision):
    profile = load_profile(name)
    requests = dict(warmup_requests(profile, 2048))
    assert list(requests)[:3] == ["short prompt", "long prefill (2048 words)", "tool call"]
    assert ("image" in requests) is vision
    assert all(body["model"] == profile.api_model_name for body in requests.values())
    assert len(requests["long prefill (2048 words)"]["messages"][0]["content"].split()) == 2049
    assert requests["tool call"]["tools"][0]["function"]["name"] == "get_weather"
    if vision:
        assert requests["image"]["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")


def test_the_warm_up_image_is_a_valid_png():
    import base64
    import zlib

    png = base64.b64decode(png_data_url(8).split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    idat = png.index(b"IDAT")
    length = int.from_bytes(png[idat - 4:idat], "big")
    assert len(zlib.decompress(png[idat + 4:idat + 4 + length])) == 8 * (1 + 8 * 3)


def test_a_warm_up_request_is_sent_from_stdin_not_the_url():
    cmd = request_command(8000, {"model": "m", "messages": [{"role": "user", "content": "it's"}]})
    assert cmd.endswith("http://127.0.0.1:8000/v1/chat/completions")
    assert json.loads(shlex.split(cmd)[2]) == {"model": "m", "messages": [{"role": "user", "content": "it's"}]}


@pytest.mark.parametrize("key,value", [("kernel_cache_keep_generations", 0), ("kernel_cache_prewarm_max_rounds", 1),
                                       ("kernel_cache_dir", "relative"), ("kernel_cache_prewarm_env", {"X": ""})])
def test_bad_kernel_cache_data_is_refused_naming_the_key(key, value):
    from sparkfleet.config import ConfigError

    with pytest.raises(ConfigError) as err:
        cluster(**{key: value})
    assert f"spark-a: key '{key}'" in str(err.value)
