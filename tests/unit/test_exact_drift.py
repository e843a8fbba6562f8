"""Exact recipe drift without a lab: the recorder run here as the container runs it (a launcher
exec'ing `vllm` or `python3 -m sglang.launch_server` with the recorder first on PATH/PYTHONPATH),
and the difference against what sparkfleet renders, with what stops and what explains it."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roles.guards.exact_drift import (
    ENGINE_COMMANDS, env_file_values, exact_report, launcher_argv, parse_command, rank_findings, recorder_files,
    recorder_run, stop_message,
)
from roles.serving.checks import rendered_files
from sparkfleet.model.engine import engine_args, env_file_path
from sparkfleet.model.serving import node_profile
from sparkfleet.config import build_cluster
from tests.unit.helpers import pair

REPO = Path(__file__).resolve().parents[2]
START_V1 = (REPO / "lab" / "recipe" / "start.sh").read_text()
# What lab/recipe/make-repo.sh makes of it for v3 (test_lab_standin checks the commit has exactly this).
START_V3 = START_V1.replace('exec vllm serve "$@"\n', 'exec vllm serve "$@" --max-num-seqs 64\n')
LAB = {
    "netplan_renderer": "networkd", "rdma_hca": None, "rdma_twin_hca": None, "gpu_expected": False,
    "serving_recipe_repository": "git://198.18.0.1/recipe.git", "serving_recipe_commit": "abcdef1",
}


def lab_cluster(**data):
    both = {**LAB, **data}
    return build_cluster(pair(**{"spark-a": both, "spark-b": both}))


def rendered(c, node):
    """(engine argv, environment file text) sparkfleet renders for `node`."""
    return engine_args(node_profile(node), c, node), rendered_files(c, node, None)[env_file_path(node, node.serving_dir)][0]


def record(tmp_path, launcher_text, argv, env_text, launcher_args="engine", engine="vllm", pybin=None):
    """Run the launcher with the recorder as the head runs it in the image (here: on this machine,
    the recorder's directory at tmp_path/root). (baseline, records, exit status, output)."""
    root = tmp_path / "root"
    for rel, (text, mode) in recorder_files(str(root)).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(int(mode, 8))
    (root / "out").mkdir(exist_ok=True)
    launcher = tmp_path / "start.sh"
    launcher.write_text(launcher_text)
    launcher.chmod(0o755)
    pybin = pybin or tmp_path / "pybin"  # the image's python3 (not a version manager's shim, which changes PATH)
    pybin.mkdir(parents=True, exist_ok=True)
    if not (pybin / "python3").exists():
        (pybin / "python3").symlink_to(sys.executable)
    env = {**env_file_values(env_text), "PATH": f"{pybin}:/usr/bin:/bin"}
    cmd = launcher_argv(str(launcher), launcher_args, engine, argv)
    p = subprocess.run([sys.executable, str(root / "drift_recorder.py"), "launch", "--", *cmd], env=env,
                       capture_output=True, text=True, timeout=30)
    baseline = root / "out" / "baseline.json"
    records = root / "out" / "records.jsonl"
    return (json.loads(baseline.read_text()) if baseline.exists() else None,
            [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else [],
            p.returncode, p.stdout + p.stderr)


def findings_for(tmp_path, launcher_text, c, launcher_args="engine"):
    out = {}
    for node in c.nodes:
        argv, env_text = rendered(c, node)
        baseline, records, status, log = record(tmp_path / node.name, launcher_text, argv, env_text, launcher_args,
                                                pybin=tmp_path / "pybin")
        out[node.name] = rank_findings("vllm", argv, env_file_values(env_text), baseline, records, status, log)
    return out


def test_the_recorder_sees_the_rendered_command_and_environment_exactly(tmp_path):
    c = lab_cluster(serving_env_pins={"KV_SLOTMAP_PIN": "0"})
    argv, env_text = rendered(c, c.head)
    baseline, records, status, _ = record(tmp_path, START_V1, argv, env_text)
    assert status == 0
    [rec] = records
    assert rec["argv"] == argv  # `exec vllm serve "$@"`: sparkfleet's own command line
    assert rec["env"]["PATH"] == baseline["env"]["PATH"] and "PYTHONPATH" not in rec["env"]  # the recorder's own taken out
    assert rank_findings("vllm", argv, env_file_values(env_text), baseline, records) == []


def test_v3_adds_a_flag_that_stops_until_adopted_or_acknowledged(tmp_path):
    c = lab_cluster(serving_env_pins={"KV_SLOTMAP_PIN": "1"})
    lines, stops = exact_report(findings_for(tmp_path, START_V3, c), [])
    assert lines == ["--max-num-seqs 64: the recipe passes it, sparkfleet does not [every rank] (NOT adopted)"]
    assert [(f.kind, f.name, f.value) for f in stops] == [("flag", "--max-num-seqs", ("64",))]
    message = stop_message("2a7a12582a35282b73ef6df5dde6fe860713d1f3", "start.sh", "img:2a7a125", lines, stops)
    assert message.startswith(
        "exact recipe drift at 2a7a12582a35: the recipe's launcher start.sh (run in img:2a7a125 with the engine "
        "replaced by a recorder) differs from what sparkfleet renders: --max-num-seqs 64: the recipe passes it, "
        "sparkfleet does not. To go on: adopt it (data: serving_extra_args: [\"--max-num-seqs\", \"64\"], or the "
        "profile's extra_args) or acknowledge (recipe_drift_acknowledged: [\"--max-num-seqs=64\"]). img:2a7a125 "
        "is built on the head; nothing was pushed or restarted.")

    for ack in (["--max-num-seqs"], ["--max-num-seqs=64"]):
        lines, stops = exact_report(findings_for(tmp_path, START_V3, c), ack)
        assert stops == [] and lines[0].endswith("(acknowledged in recipe_drift_acknowledged)")
    assert exact_report(findings_for(tmp_path, START_V3, c), ["--max-num-seqs=32"])[1] != []  # another value

    # Adopted: sparkfleet renders it too (the launcher then passes it twice, with one value): no difference.
    adopted = lab_cluster(serving_env_pins={"KV_SLOTMAP_PIN": "1"}, serving_extra_args=["--max-num-seqs", "64"])
    assert exact_report(findings_for(tmp_path, START_V3, adopted), []) == ([], [])
    # Adopted with another value: sparkfleet's is the one the pair runs; reported, not a stop.
    other = lab_cluster(serving_env_pins={"KV_SLOTMAP_PIN": "1"}, serving_extra_args=["--max-num-seqs=32"])
    lines, stops = exact_report(findings_for(tmp_path, START_V3, other), [])
    assert stops == [] and lines == ["--max-num-seqs: the recipe passes 64, sparkfleet 32 (pinned by sparkfleet) [every rank]"]


def test_a_variable_the_launcher_sets_stops_until_pinned_or_acknowledged(tmp_path):
    c = lab_cluster()  # KV_SLOTMAP_PIN pinned nowhere: start.sh exports its default
    lines, stops = exact_report(findings_for(tmp_path, START_V1, c), [])
    assert lines == ["KV_SLOTMAP_PIN: the launcher sets 0, sparkfleet does not [every rank] (NOT pinned)"]
    message = stop_message("abcdef1", "start.sh", "img", lines, stops)
    assert 'pin (serving_env_pins: {"KV_SLOTMAP_PIN": "0"}) or acknowledge (recipe_drift_acknowledged: ["KV_SLOTMAP_PIN"])' in message
    lines, stops = exact_report(findings_for(tmp_path, START_V1, c), ["KV_SLOTMAP_PIN"])
    assert stops == [] and "acknowledged" in lines[0]


def test_a_launcher_overriding_a_pinned_value_is_reported_not_stopped(tmp_path):
    c = lab_cluster(serving_env_pins={"KV_SLOTMAP_PIN": "0"})
    forced = START_V1.replace("exec vllm", 'export CG_ESTIMATE=1 PATH="/opt/venv/bin:$PATH"\nexec vllm')
    lines, stops = exact_report(findings_for(tmp_path, forced, c), [])
    assert "CG_ESTIMATE: the launcher sets 1, sparkfleet renders 0 (pinned by sparkfleet to 0) [every rank]" in lines
    assert [f.name for f in stops] == ["PATH"]  # the image's PATH, changed: sparkfleet pins no PATH
    assert lines[-1].startswith("PATH: the launcher sets /opt/venv/bin:") and "(the image has " in lines[-1]


def test_a_launcher_that_builds_its_own_command_line(tmp_path):
    """launcher_args none: the launcher gets nothing and builds the command from its environment."""
    own = "#!/bin/sh\nexec vllm serve /models/x --max-model-len \"$MAX_MODEL_LEN\" --max-num-seqs 8\n"
    c = lab_cluster(serving_env_pins={"KV_SLOTMAP_PIN": "0"})
    argv, env_text = rendered(c, c.head)
    baseline, records, _, _ = record(tmp_path, own, argv, env_text, launcher_args="none")
    assert records[0]["argv"] == ["vllm", "serve", "/models/x", "--max-model-len", "640000", "--max-num-seqs", "8"]
    found = rank_findings("vllm", argv, env_file_values(env_text), baseline, records)
    by_name = {f.name or f.kind: f for f in found}
    assert by_name["--max-num-seqs"].stops and "--max-model-len" not in by_name  # the same value: no difference
    assert not by_name["positional"].stops and "/models/x" in by_name["positional"].text
    assert not by_name["--headless" if "--headless" in by_name else "--port"].stops  # sparkfleet's own flags


def test_sglang_is_recorded_through_python_m(tmp_path):
    launcher = '#!/bin/sh\nexec python3 -m sglang.launch_server "$@" --max-running-requests 16\n'
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/q", "--tp-size", "2"]
    baseline, records, status, log = record(tmp_path, launcher, argv, "A=1\n", engine="sglang")
    assert status == 0, log
    assert records[0]["argv"] == argv + ["--max-running-requests", "16"]
    [f] = rank_findings("sglang", argv, {"A": "1"}, baseline, records)
    assert (f.name, f.value, f.stops) == ("--max-running-requests", ("16",), True)


def test_a_launcher_that_starts_no_engine_or_another_one_stops(tmp_path):
    argv = ["vllm", "serve", "/models/x"]
    baseline, records, status, log = record(tmp_path, "#!/bin/sh\necho no GPU here >&2\nexit 3\n", argv, "")
    [f] = rank_findings("vllm", argv, {}, baseline, records, status, log)
    assert f.kind == "run" and f.stops and "exited with 3" in f.text and "no GPU here" in f.text
    assert exact_report({"spark-a": [f]}, ["--anything"])[1] == [f]  # nothing in data explains it
    assert "check the profile's recipe.launcher and recipe.launcher_args" in stop_message("c0ffee1", "s", "i", [], [f])
    _, records, _, _ = record(tmp_path / "x", '#!/bin/sh\nexec vllm bench "$@"\n', argv, "")
    [f] = rank_findings("vllm", argv, {}, None, records)
    assert f.kind == "command" and "`vllm bench /models/x`, not `vllm serve`" in f.text


def test_parse_command_reads_every_spelling():
    cmd = parse_command("vllm", ["vllm", "serve", "/m", "--a_b=1", "--c", "x", "y", "--flag", "--n", "-1", "--a-b", "1"])
    assert cmd.command == ("vllm", "serve") and cmd.positionals == ("/m",)
    assert cmd.flags == {"--a-b": [("1",)], "--c": [("x", "y")], "--flag": [()], "--n": [("-1",)]}


def test_launcher_argv_modes_and_where_the_launcher_is():
    argv = ["vllm", "serve", "/models/m", "--x", "1"]
    assert launcher_argv("start.sh", "engine", "vllm", argv) == ["/sfl-recipe/start.sh", "/models/m", "--x", "1"]
    assert launcher_argv("/opt/recipe/start.sh", "flags", "vllm", argv) == ["/opt/recipe/start.sh", "--x", "1"]
    assert launcher_argv("start.sh", "none", "vllm", argv) == ["/sfl-recipe/start.sh"]
    sgl = [*ENGINE_COMMANDS["sglang"], "--model-path", "/m"]
    assert launcher_argv("l.sh", "engine", "sglang", sgl) == ["/sfl-recipe/l.sh", "--model-path", "/m"]


def test_the_recorder_run_has_no_network_and_mounts_what_production_reads():
    cmd = recorder_run("sparkfleet/x:abc", "/tmp/t/rank0.env", "/tmp/t/mnt", "/var/lib/r", "/var/lib/m",
                       ["/sfl-recipe/start.sh", "/models/m", "--speculative-config", '{"a":1}'], "sfl-exact-drift-0")
    assert cmd.startswith("timeout 300 docker run --rm --pull=never --name sfl-exact-drift-0 --network=none "
                          "--env-file=/tmp/t/rank0.env --volume=/tmp/t/mnt:/sfl-drift --volume=/var/lib/r:/sfl-recipe:ro "
                          "--volume=/var/lib/m:/models:ro sparkfleet/x:abc python3 /sfl-drift/drift_recorder.py launch -- ")
    assert cmd.endswith("""/sfl-recipe/start.sh /models/m --speculative-config '{"a":1}'""")
    assert "--gpus" not in cmd


def test_acknowledged_entries_are_validated():
    with pytest.raises(Exception) as err:
        lab_cluster(recipe_drift_acknowledged=["KV_SLOTMAP_PIN", "--max-num-seqs=64", "max num seqs"])
    assert "['max num seqs']: each entry is a variable name" in str(err.value)


def test_extra_args_are_appended_on_every_rank_and_never_repeat_a_rendered_flag():
    c = lab_cluster(serving_extra_args=["--max-num-seqs", "64"])
    for node in c.nodes:
        assert engine_args(node_profile(node), c, node)[-2:] == ["--max-num-seqs", "64"]
    for bad, message in ((["--max_model_len", "5"], "--max-model-len in extra args"),
                         (["--load-format=dummy"], "refusing to render '--load-format dummy'"),
                         (["64"], "must start with a flag")):
        with pytest.raises(Exception) as err:
            lab_cluster(serving_extra_args=bad)
        assert message in str(err.value), err.value
    with pytest.raises(Exception) as err:
        build_cluster(pair(**{"spark-a": {**LAB, "serving_extra_args": ["--max-num-seqs", "64"]}, "spark-b": LAB}))
    assert "key 'serving_extra_args' differs between nodes" in str(err.value)
