"""roles/kernel_cache: generations, retention, manifest comparison, the per-engine cache variables,
the prewarm (production's command line and environment, plus only PREWARM_ENV_ADDITIONS) and the
warm-up set."""
import ast
import json
import shlex
from pathlib import Path

import pytest

from roles.kernel_cache.checks import (
    PREWARM_CONTAINER, expired, generation, manifest_differences, missing_entries, pinned_image_source,
    prewarm_command, prewarm_env_file, prewarm_env_path, prewarm_reason, warmed_caches,
)
from sparkfleet.chat_request import request_command
from sparkfleet.model.kernel_cache import CACHE_VARS, PREWARM_ENV_ADDITIONS, cache_vars
from roles.kernel_cache.warmup import png_data_url, warmup_requests
from roles.serving.checks import rendered_files
from sparkfleet.model.engine import env_file_path, rank_env, served_image
from sparkfleet.model.serving import load_profile, node_profile
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair
from tests.unit.test_serving_render import GIDS, PROFILES, env_of
from tests.unit.test_serving_render import cluster as serving_cluster

REPO = Path(__file__).resolve().parents[2]
STANDINS = {"vllm": REPO / "lab/standin/vllm", "sglang": REPO / "lab/standin/sglang/launch_server.py"}


def manifest(*entries):
    return "# sparkfleet kernel cache manifest v1\n" + "".join(f"{sha}\t{size}\t{path}\n" for path, size, sha in entries)


def test_a_generation_is_named_by_the_image_id():
    assert generation("sha256:0123456789abcdef0123") == "0123456789ab"
    assert generation(None) is None


def test_retention_keeps_the_current_generation_and_the_newest_others():
    a, b, c, d = (ch * 12 for ch in "abcd")
    gens = {a: 1.0, b: 2.0, c: 3.0, d: 4.0}
    assert expired(gens, keep=2, current=a) == [b, c]  # a (current) and d (newest other) stay
    assert expired(gens, keep=1, current=d) == [a, b, c]
    assert expired(gens, keep=4, current=a) == []
    assert expired(gens, keep=2, current=None) == [a, b]  # not linked yet: the two newest stay


def test_retention_removes_only_generations_sparkfleet_made():
    """Anything else under kernel_cache_dir (an operator's directory, 'current', a name that is not
    12 hex digits, a 12-hex directory without its manifest) is never a candidate."""
    from roles.kernel_cache.facts import CacheState

    root = "/var/lib/sparkfleet/kernel-cache"
    lines = [f"G\t{name}\t{t}" for name, t in (("0123456789ab", 1.0), ("backup", 0.5), ("..", 0.1),
                                                 ("0123456789abcdef", 0.2), ("fedcba987654", 0.3),
                                                 ("aaaaaaaaaaaa", 2.0))]
    lines += ["N\t0123456789ab.manifest", "N\taaaaaaaaaaaa.manifest", "N\tbackup.manifest"]
    facts = CacheState().process(lines)
    assert facts["generations"] == {"0123456789ab": 1.0, "aaaaaaaaaaaa": 2.0}
    assert expired(facts["generations"], keep=1, current="aaaaaaaaaaaa") == ["0123456789ab"]
    assert expired({"backup": 0.0, "../etc": 0.0, "0123456789ab": 1.0}, keep=1, current=None) == []
    assert root  # the command lists directories and manifests of the root only
    assert "-maxdepth 1" in CacheState().command(root, "img:tag")


def test_a_generation_warmed_for_another_set_of_caches_is_warmed_again():
    files = "".join(f"s\t1\t{p}\n" for p in ("vllm/a", "triton/b"))
    warmed = {e: f"# sparkfleet kernel cache manifest v1\n# image: sha256:ab\n# caches: {warmed_caches(e)}\n" + files
              for e in CACHE_VARS}
    assert warmed_caches("vllm") == ",".join(sorted(cache_vars("vllm")))
    assert prewarm_reason(None, None, "vllm") == "the image is built in this run"
    assert prewarm_reason("0123456789ab", None, "vllm") == "generation 0123456789ab was never warmed"
    assert prewarm_reason("0123456789ab", warmed["vllm"].split("s\t")[0], "vllm") == "generation 0123456789ab was never warmed"
    assert prewarm_reason("0123456789ab", warmed["vllm"], "vllm") is None
    assert prewarm_reason("0123456789ab", warmed["sglang"], "sglang") is None
    old = "# sparkfleet kernel cache manifest v1\n# image: sha256:ab\n" + files  # before the header existed
    for reference in (old, warmed["sglang"]):
        assert prewarm_reason("0123456789ab", reference, "vllm") == \
            "generation 0123456789ab was warmed for another set of cache variables"


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
    command = prewarm_command(profile, c, c.node("spark-b"))
    assert command.startswith(". /etc/sparkfleet/sparkfleet-worker.image && /usr/bin/docker run --detach ")
    assert '"${SPARKFLEET_IMAGE}" vllm serve ' in command  # the worker's pinned digest, as its unit runs it
    words = shlex.split(command.removeprefix(pinned_image_source(c.node("spark-b"))))
    assert words[:3] == ["/usr/bin/docker", "run", "--detach"]
    assert words[words.index("--name") + 1] == "sparkfleet-prewarm"
    assert "--env-file=/etc/sparkfleet/sparkfleet-worker.prewarm.env" in words
    assert "--volume=/var/lib/sparkfleet/kernel-cache/current:/var/cache/sparkfleet" in words
    assert "--headless" in words and words[words.index("--node-rank") + 1] == "1"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_cache_variable_of_the_engine_and_no_other_points_into_the_mounted_generation(profile):
    c = cluster(serving_profile=profile)
    engine = load_profile(profile).engine
    env = rank_env(load_profile(profile), c, c.node("spark-a"), 3)
    every = {var for table in CACHE_VARS.values() for var in table}
    assert {v: env[v] for v in every if v in env} == {v: f"/var/cache/sparkfleet/{sub}" for v, sub in cache_vars(engine).items()}


def test_each_engine_has_its_own_stacks_caches_each_in_its_own_directory():
    assert set(cache_vars("vllm")) == {
        "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR",
        "FLASHINFER_WORKSPACE_BASE", "TILELANG_CACHE_DIR", "CUTE_DSL_CACHE_DIR", "TVM_FFI_CACHE_DIR",
        "CUDA_CACHE_PATH", "DG_JIT_CACHE_DIR"}
    # SGLang reads no VLLM_CACHE_ROOT, and sets DG_JIT_CACHE_DIR itself from SGLANG_DG_CACHE_DIR.
    assert set(cache_vars("sglang")) == {
        "SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "SGLANG_DG_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "FLASHINFER_WORKSPACE_BASE", "TILELANG_CACHE_DIR",
        "CUTE_DSL_CACHE_DIR", "TVM_FFI_CACHE_DIR", "CUDA_CACHE_PATH"}
    for engine, table in CACHE_VARS.items():
        subdirs = [c.subdir for c in table.values()]
        assert len(set(subdirs)) == len(subdirs), engine  # no two caches share a directory
        assert all(c.subdir and "/" not in c.subdir and c.reader and c.source for c in table.values()), engine


@pytest.mark.parametrize("engine", sorted(STANDINS))
def test_each_lab_standin_writes_exactly_its_engines_cache_variables(engine):
    tree = ast.parse(STANDINS[engine].read_text())
    [names] = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
               and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["JIT_CACHES"]]
    assert names == tuple(cache_vars(engine))


def parsed_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def exec_start_words(unit_text: str) -> list[str]:
    """The ExecStart= command of a unit as words: its line and every continued one, systemd's
    escapes undone."""
    lines = unit_text.split("\nExecStart=", 1)[1].splitlines()
    command = []
    for line in lines:
        command.append(line.rstrip("\\"))
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(command).replace("%%", "%").replace("$$", "$"))


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", ["spark", "lab"])
@pytest.mark.parametrize("name", ["spark-a", "spark-b"])
def test_the_prewarm_runs_productions_argv_and_env_with_only_the_named_additions(kind, name, profile):
    c = serving_cluster(kind, profile)
    node = c.node(name)
    served = node_profile(node)
    additions = PREWARM_ENV_ADDITIONS[served.engine]
    gid = GIDS[name] if node.rdma_hca else None
    # Environment: the file production's unit reads, and the prewarm's, line for line, except the
    # named additions (keys of the engine's list, with its values); nothing else added or changed.
    files = rendered_files(c, node, gid)
    [production_text] = [t for p, (t, _) in files.items() if p.endswith(".env")]
    [unit_text] = [t for p, (t, _) in files.items() if p.endswith(".service")]
    prewarm_text = prewarm_env_file(served, c, node, gid)
    production, prewarm = parsed_env(production_text), parsed_env(prewarm_text)
    assert production == env_of(kind, name, profile)
    named = tuple(f"{key}=" for key in additions)
    assert [l for l in prewarm_text.splitlines() if not l.startswith(named)] == \
        [l for l in production_text.splitlines() if not l.startswith(named)]
    assert {k: prewarm[k] for k in additions} == additions
    differing = {k for k in production.keys() | prewarm.keys() if production.get(k) != prewarm.get(k)}
    assert differing == {k for k, v in additions.items() if production.get(k) != v}
    # Command line: the unit's ExecStart word for word, detached, with the prewarm's name and env file.
    unit = exec_start_words(unit_text)
    assert unit[:2] == ["/usr/bin/docker", "run"] and unit[-1] != "#"
    # Not --rm: a prewarm engine that dies leaves its container, so the deploy can print its log.
    expected = unit[:2] + ["--detach"] + [w for w in unit[2:] if w != "--rm"]
    assert "--rm" in unit
    assert expected[expected.index("--name") + 1] == ("sparkfleet-head" if node.is_head else "sparkfleet-worker")
    expected[expected.index("--name") + 1] = PREWARM_CONTAINER
    expected[expected.index(f"--env-file={env_file_path(node, node.serving_dir)}")] = f"--env-file={prewarm_env_path(node)}"
    # A worker's image word is its pinned digest's variable, set from the file its unit reads.
    command = prewarm_command(served, c, node)
    assert node.is_head or command.startswith(pinned_image_source(node))
    words = shlex.split(command.removeprefix("" if node.is_head else pinned_image_source(node)))
    assert words == expected
    image = served_image(served, node)
    assert words[words.index(image) + 1:] == unit[unit.index(image) + 1:]  # the engine's argv


def test_prewarm_additions_are_a_short_fixed_list():
    assert PREWARM_ENV_ADDITIONS == {"vllm": {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "7200"}, "sglang": {}}
    # Hashed into vLLM's torch.compile cache key (vllm/envs.py compile_factors): never in the list.
    assert not {"VLLM_ENGINE_READY_TIMEOUT_S"} & {k for a in PREWARM_ENV_ADDITIONS.values() for k in a}


@pytest.mark.parametrize("name,vision,tools", [("glm-5.3-flash-exl3", True, True), ("deepseek-v4-flash", False, False)])
def test_the_warm_up_set_covers_short_long_tools_and_images_when_vision_is_on(name, vision, tools):
    profile = load_profile(name)
    requests = dict(warmup_requests(profile, 2048))
    # a tool call only where the profile parses them (vLLM answers 400 to tool_choice "auto" otherwise)
    assert list(requests)[:3] == ["short prompt", "long prefill (2048 words)"] + (["tool call"] if tools else
                                                                                 (["image"] if vision else []))
    assert ("image" in requests) is vision
    assert ("tool call" in requests) is (profile.tool_call_parser is not None)
    assert all(body["model"] == profile.api_model_name for body in requests.values())
    assert len(requests["long prefill (2048 words)"]["messages"][0]["content"].split()) == 2049
    if tools:
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


def test_a_warm_up_request_is_sent_from_stdin_not_the_url_through_tls_verified_with_the_bundle():
    cmd = request_command("https://10.0.0.11:8000", "--cacert /etc/sparkfleet/tls/ca.crt",
                          {"model": "m", "messages": [{"role": "user", "content": "it's"}]})
    assert cmd.endswith(" https://10.0.0.11:8000/v1/chat/completions")
    words = shlex.split(cmd)
    assert json.loads(words[2]) == {"model": "m", "messages": [{"role": "user", "content": "it's"}]}
    assert words[words.index("--cacert") + 1] == "/etc/sparkfleet/tls/ca.crt" and "-k" not in words


@pytest.mark.parametrize("key,value", [("kernel_cache_keep_generations", 0), ("kernel_cache_prewarm_max_rounds", 1),
                                       ("kernel_cache_dir", "relative")])
def test_bad_kernel_cache_data_is_refused_naming_the_key(key, value):
    from sparkfleet.config import ConfigError

    with pytest.raises(ConfigError) as err:
        cluster(**{key: value})
    assert f"spark-a: key '{key}'" in str(err.value)


def test_a_prewarm_environment_in_data_is_refused():
    """Gone: the prewarm's environment is production's plus PREWARM_ENV_ADDITIONS, never data."""
    from sparkfleet.config import ConfigError

    with pytest.raises(ConfigError) as err:
        cluster(kernel_cache_prewarm_env={"VLLM_ENGINE_READY_TIMEOUT_S": "7200"})
    assert "spark-a: unknown key 'kernel_cache_prewarm_env'" in str(err.value)
