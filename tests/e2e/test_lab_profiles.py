"""Switching the served profile with one change in data, and back; state checks after each switch.

Runs after test_lab_fabric.py and test_lab_guards.py, with the pair serving the inventory's profile.
"""
import json

import pytest

from sparkfleet.model.serving import load_profile
from tests.e2e.lab import REPO, deploy, models_command, on, state_checks

LAB_V1 = dict(l.split() for l in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if l.strip())["v1"]

pytestmark = pytest.mark.lab


def served_models() -> list[str]:
    return [m["id"] for m in json.loads(on("spark-a", models_command()))["data"]]


def engine_of(host: str, container: str) -> str:
    return on(host, f"docker inspect --format '{{{{json .Config.Cmd}}}}' {container}")


# In this order, each switch from the one before (the first from the inventory's glm-5.3-flash-exl3):
# every profile is switched to once; the idempotent rerun and the way back are proven once, from the
# last (each switch's own back-and-forth cost this module about 80 s and reached no other code).
SWITCHES = ["qwen3.8-flash-next", "deepseek-v4-flash", "glm-5.3-flash-exl3-mtp"]


@pytest.mark.parametrize("name", SWITCHES)
def test_switching_to_a_profile(name):
    profile = load_profile(name)
    run = deploy("--data", f"serving_profile={name}")
    assert run.returncode == 0, run.output
    changed = run.changed()
    # The old pair stops head first, the new pair starts worker first.
    order = [op for op, _ in changed if op in (
        "Stop the head (the pair restarts)", "Restart the workers (workers first)", "Start the head (every worker is up)")]
    assert order == ["Stop the head (the pair restarts)", "Restart the workers (workers first)",
                     "Start the head (every worker is up)"], changed
    assert served_models() == [profile.api_model_name]
    if profile.engine == "sglang":
        assert "sglang.launch_server" in engine_of("spark-b", "sparkfleet-worker")
        assert "--headless" not in engine_of("spark-b", "sparkfleet-worker")
        # SGLang logs no vLLM-style KV-cache line: the check says it verified nothing, instead of reading
        # the line the vLLM engine this switch replaced left in the unit's journal of this boot.
        assert "the engine logged no 'GPU KV cache size'; KV budget not verified" in run.output, run.output[-4000:]
        assert "engine KV cache" not in run.output
    checks = state_checks(f"--data=serving_profile={name}")
    assert checks.returncode == 0, checks.output


def test_a_switched_pair_redeploys_nothing_and_one_change_in_data_switches_it_back():
    last = SWITCHES[-1]
    assert served_models() == [load_profile(last).api_model_name]  # the switches above ran, in order
    assert deploy("--data", f"serving_profile={last}").changed() == []
    back = deploy()
    assert back.returncode == 0, back.output
    # Every other profile's image stays on every node (nothing is pruned unless data says so).
    for name in SWITCHES:
        for host in ("spark-a", "spark-b"):
            assert on(host, f"docker image inspect {load_profile(name).image}:{LAB_V1} >/dev/null && echo kept").strip() == "kept"
    assert served_models() == [load_profile("glm-5.3-flash-exl3").api_model_name]
    assert state_checks().returncode == 0


def test_other_profiles_images_are_pruned_only_when_data_says_so():
    other = load_profile("qwen3.8-flash-next").image
    for host in ("spark-a", "spark-b"):
        assert on(host, f"docker image inspect {other}:{LAB_V1} >/dev/null && echo kept").strip() == "kept"
    run = deploy("--data", "serving_prune_other_profiles=true")
    assert run.returncode == 0, run.output
    assert {h for op, h in run.changed() if op.startswith("Remove other profiles")} == {"spark-a", "spark-b"}
    for host in ("spark-a", "spark-b"):
        assert on(host, f"docker image inspect {other}:{LAB_V1} >/dev/null 2>&1 || echo gone").strip() == "gone"
        assert on(host, f"docker image inspect sparkfleet/glm-5.3-flash-exl3:{LAB_V1} >/dev/null && echo kept").strip() == "kept"
    assert deploy("--data", "serving_prune_other_profiles=true").changed() == []
