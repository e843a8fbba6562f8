"""Guards on the lab: a bring-up that cannot fit in memory is refused in seconds, with the numbers.

Runs after test_lab_fabric.py, whose deploys leave the pair serving.
"""
import re

import pytest

from sparkfleet.model.serving import load_profile
from tests.e2e.lab import BIN, INVENTORY, REPO, deploy, models_command, on, pause_watchdogs, run

pytestmark = pytest.mark.lab

# The memory share the lab serves the shipped profile with (lab/profiles/glm-5.3-flash-exl3.yaml).
SHARE = load_profile("glm-5.3-flash-exl3", site_dir=str(REPO / "lab")).gpu_memory_utilization


def test_memory_admission_refuses_a_bring_up_that_does_not_fit_and_changes_nothing():
    # A bring-up: no engine running on either rank (and no watchdog to start them again).
    pause_watchdogs()
    on("spark-a", "systemctl stop sparkfleet-head")
    on("spark-b", "systemctl stop sparkfleet-worker")
    # Lab-sized numbers: the lab's share of its MemTotal (lab/profiles/: 0.5) fits; 64 GiB of headroom on top cannot.
    run = deploy("--data", "guard_min_headroom_gib=64")
    assert run.returncode != 0
    assert "guards refused the deploy, nothing was changed" in run.output
    for host in ("spark-a", "spark-b"):
        m = re.search(rf"memory: {SHARE:.2f} x ([0-9.]+) GiB = ([0-9.]+) GiB needed \+ 64\.00 GiB headroom, "
                      rf"([0-9.]+) GiB free on {host}", run.output)
        assert m, run.output
        assert abs(SHARE * float(m[1]) - float(m[2])) < 0.01
    assert run.results() == []  # refused at prepare: no operation ran

    # Without the headroom the same bring-up fits, and the pair serves again.
    run = deploy()
    assert run.returncode == 0, run.output
    assert "fits" in run.output
    assert '"id": "glm-5.3-flash"' in on("spark-a", models_command())


def doctor():
    return run([str(BIN / "pyinfra"), "-y", INVENTORY, "doctor.py"])


def test_the_doctor_passes_on_a_healthy_pair_and_changes_nothing():
    result = doctor()
    assert result.returncode == 0, result.output
    assert "sparkfleet doctor (read-only)" in result.output and "checks passed" in result.output
    assert re.search(r"^plan\s+pair\s+ok$", result.output, re.M), result.output  # a deploy would do nothing
    assert result.results() == []
    # The doctor naming a broken link and leaving it as it is: tests/e2e/test_lab_fabric.py's MTU drift,
    # where spark-b's link is broken by hand anyway and a deploy repairs it (here that repair was a deploy more).


def test_an_engine_kv_cache_below_max_model_len_fails_verification_with_the_numbers():
    # The stand-in reports what SFL_STANDIN_KV_TOKENS says, as vLLM logs "GPU KV cache size: N tokens".
    small = deploy("--data", 'serving_env_pins={"SFL_STANDIN_KV_TOKENS": "1000"}')
    assert small.returncode != 0
    assert "spark-a: the engine's KV cache holds 1000 tokens < max_model_len 640000" in small.output
    fixed = deploy()
    assert fixed.returncode == 0, fixed.output
    assert "engine KV cache 1280000 tokens >= max_model_len 640000" in fixed.output


def test_kv_budget_refuses_a_context_that_cannot_fit_from_config_json_and_weight_sizes():
    # What the weights role leaves on the head: config.json and the safetensors (a sparse 2 GiB file
    # stands in for the weights; only its size is read). A DeepSeek-V3-shaped MLA config.
    model_dir = "/var/lib/sparkfleet/models/brandonmusic/GLM-5.3-Flash-tr3-4bpw"
    config = '{"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 128}'
    on("spark-a", f"mkdir -p {model_dir} && echo '{config}' > {model_dir}/config.json && "
                  f"truncate -s 2G {model_dir}/model-00001-of-00001.safetensors")
    try:
        run = deploy()
        assert run.returncode != 0
        assert re.search(rf"kv budget on spark-a: {SHARE:.2f} x [0-9.]+ GiB - weights 2\.0/2 GiB - drafter 0\.0/2 GiB - "
                         r"reserve 4\.0 GiB = [0-9.]+ GiB for KV at 40016 B/token = [0-9]+ tokens < max_model_len 640000",
                         run.output), run.output
        assert run.results() == []
    finally:
        on("spark-a", "rm -rf /var/lib/sparkfleet/models")
    assert deploy().returncode == 0
