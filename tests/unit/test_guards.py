"""Every guard with a case that passes and a case that fails; the report's numbers replayed."""
import re

import pytest

from sparkfleet.model.guard_rules import flag_value, license_gate, memory_admission, parse_size, refused_settings, top_consumers
from sparkfleet.model.serving import load_profile


# 1. Memory admission: the report's head, 121.69 GiB total, 101.46 GiB free.
def test_utilization_084_with_101_46_free_is_refused_with_the_numbers():
    msg = memory_admission("spark-a", 0.84, 121.69, 101.46, profile="glm-5.3-flash-exl3")
    assert msg is not None
    assert "0.84 x 121.69 GiB = 102.22 GiB needed, 101.46 GiB free on spark-a" in msg


def test_the_memory_refusal_names_what_the_user_can_change_the_profiles_file():
    """gpu_memory_utilization is a profile's field, not a data key: the advice names the file it is in."""
    from sparkfleet.config import DATA_FIELDS
    from sparkfleet.model.serving import PROFILES_DIR

    msg = memory_admission("spark-a", 0.84, 121.69, 101.46, profile="glm-5.3-flash-exl3")
    path = re.search(r"lower gpu_memory_utilization in (\S+\.yaml) ", msg)[1]
    assert (PROFILES_DIR.parents[2] / path).is_file(), path
    assert re.search(r"^gpu_memory_utilization: 0\.79\b", (PROFILES_DIR.parents[2] / path).read_text(), re.M)
    assert "gpu_memory_utilization" not in DATA_FIELDS  # hence the file, copied into the site to change it
    # A site's profiles/NAME.yaml replaces the shipped one (tests/unit/test_site.py): no tracked file edited.
    assert "your site's profiles/glm-5.3-flash-exl3.yaml with `base: glm-5.3-flash-exl3` and the field changes only it" in msg


def test_utilization_079_is_accepted():
    assert memory_admission("spark-a", 0.79, 121.69, 101.46, profile="glm-5.3-flash-exl3") is None


def test_headroom_counts_on_top():
    assert memory_admission("spark-b", 0.79, 121.69, 101.46, headroom_gib=6.0, profile="glm-5.3-flash-exl3") is not None
    assert "+ 6.00 GiB headroom" in memory_admission("spark-b", 0.79, 121.69, 101.46, headroom_gib=6.0, profile="glm-5.3-flash-exl3")


def test_sizes_parse_as_docker_prints_them():
    assert parse_size("19.5MiB") == 19.5 * 1024**2 and parse_size("1GB") == 1e9 and parse_size("0B") == 0
    with pytest.raises(ValueError):
        parse_size("lots")


# 2. Headroom: the largest consumers outside the engine (the report lost ~12 GB to polkitd).
def test_top_consumers_skip_containers_and_sum_by_name():
    lines = [
        "12582912 0::/system.slice/polkit.service polkitd",
        "9000000 12:memory:/docker/3f2a9c1b7e4d5a6b python3",
        "204800 0::/system.slice/dockerd.service dockerd",
        "102400 0::/user.slice bash",
        "102400 0::/user.slice bash",
    ]
    top = top_consumers(lines)
    assert [name for name, _ in top] == ["polkitd", "dockerd", "bash"]
    assert top[0][1] == pytest.approx(12.0)


# 4. Settings refused with a reason.
OK_WORKER = ["vllm", "serve", "m", "--distributed-executor-backend", "mp", "--node-rank", "1", "--headless"]


def test_a_clean_worker_passes():
    assert refused_settings("spark-b", OK_WORKER, {"NCCL_IB_GID_INDEX": "3"}, False, "vllm", False) == []


@pytest.mark.parametrize(
    "args, env, fragment",
    [
        (OK_WORKER + ["--load-format", "dummy"], {}, "--load-format dummy"),
        (OK_WORKER + ["--load-format=dummy"], {}, "--load-format dummy"),
        (OK_WORKER + ["--no-ple-offload-embedding"], {}, "--no-ple-offload-embedding"),
        (["vllm", "serve", "m", "--distributed-executor-backend", "ray", "--headless"], {}, "Ray's memory monitor"),
        (["vllm", "serve", "m", "--node-rank", "1"], {}, "without --headless"),
        (OK_WORKER, {"NCCL_IB_GID_INDEX": ""}, "NCCL_IB_GID_INDEX is empty"),
    ],
)
def test_each_refused_setting_is_named(args, env, fragment):
    [msg] = refused_settings("spark-b", args, env, False, "vllm", False)
    assert msg.startswith("spark-b: ") and fragment in msg


def test_ray_is_allowed_only_on_purpose():
    args = ["vllm", "serve", "m", "--distributed-executor-backend", "ray", "--headless"]
    assert refused_settings("spark-b", args, {}, False, "vllm", allow_ray=True) == []


def test_sglang_workers_need_no_headless():
    assert refused_settings("spark-b", ["python3", "-m", "sglang.launch_server"], {}, False, "sglang", False) == []


def test_flag_value_reads_both_spellings():
    assert flag_value(["--a", "1", "--b=2"], "--a") == "1" and flag_value(["--b=2"], "--b") == "2"
    assert flag_value(["--a"], "--a") is None


# 5. License gate.
def test_dflash2_drafter_is_refused_in_production_naming_the_mtp_fallback():
    msg = license_gate(load_profile("glm-5.3-flash-exl3"), "production", None)
    assert "CC-BY-NC-ND-4.0" in msg and "MTP" in msg and "deployment_purpose is production" in msg


def test_dflash2_drafter_needs_the_acknowledgement_for_research():
    profile = load_profile("glm-5.3-flash-exl3")
    assert "drafter_license_acknowledged: CC-BY-NC-ND-4.0" in license_gate(profile, "research", None)
    assert license_gate(profile, "research", "CC-BY-NC-ND-4.0") is None


def test_a_profile_without_a_restricted_drafter_passes_in_production():
    profile = load_profile("glm-5.3-flash-exl3").model_copy(update={"speculative": None})
    assert license_gate(profile, "production", None) is None


# 7. Recipe drift.
from roles.guards.drift import drift_report, launch_defaults  # noqa: E402

START_V1 = '''#!/bin/sh
: "${CG_ESTIMATE:=0}"
: ${MAX_NUM_BATCHED_TOKENS:=2048}
export DFLASH_DRAFT_TP=${DFLASH_DRAFT_TP:-1}
LANGUAGE_MODEL_ONLY="${LANGUAGE_MODEL_ONLY:-0}"
PORT=8000
exec vllm serve "$@"
'''
START_V2 = START_V1.replace('CG_ESTIMATE:=0', 'CG_ESTIMATE:=1').replace("PORT=8000", "PORT=8000\n: \"${KV_SLOTMAP_PIN:=1}\"")


def test_launch_defaults_read_every_spelling():
    assert launch_defaults(START_V1) == {
        "CG_ESTIMATE": "0", "MAX_NUM_BATCHED_TOKENS": "2048", "DFLASH_DRAFT_TP": "1",
        "LANGUAGE_MODEL_ONLY": "0", "PORT": "8000"}


def test_the_cg_estimate_flip_is_reported_and_passes_when_pinned():
    lines, stops = drift_report(launch_defaults(START_V1), launch_defaults(START_V1.replace("CG_ESTIMATE:=0", "CG_ESTIMATE:=1")),
                                {"CG_ESTIMATE": "0"}, [])
    assert lines == ["CG_ESTIMATE: 0 -> 1 (pinned by sparkfleet to 0)"] and stops == []


def test_an_unpinned_changed_default_stops_until_pinned_or_acknowledged():
    old, new = launch_defaults(START_V1), launch_defaults(START_V2)
    lines, stops = drift_report(old, new, {"CG_ESTIMATE": "0"}, [])
    assert stops == ["KV_SLOTMAP_PIN"] and "KV_SLOTMAP_PIN: (unset) -> 1 (NOT pinned)" in lines
    assert drift_report(old, new, {"CG_ESTIMATE": "0", "KV_SLOTMAP_PIN": "0"}, [])[1] == []
    assert drift_report(old, new, {"CG_ESTIMATE": "0"}, ["KV_SLOTMAP_PIN"])[1] == []


def test_unchanged_defaults_report_nothing():
    assert drift_report(launch_defaults(START_V1), launch_defaults(START_V1), {}, []) == ([], [])


def test_model_files_fact_reads_config_and_weight_size():
    from roles.guards.facts import ModelFiles

    out = ModelFiles().process(["---config", '{"num_hidden_layers": 2}', "", "---end", "weights_bytes=2147483648"])
    assert out == {"config": '{"num_hidden_layers": 2}\n', "weights_bytes": 2147483648}
    assert ModelFiles().process(["weights_bytes=0"]) == {"config": None, "weights_bytes": 0}
