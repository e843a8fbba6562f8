"""bench/prepare_cpu.py: the deploy and its floor run under pyinfra's @fake connector, every node answered
from the lab's capture bundle (tests/unit/fixtures/capture-lab.json, taken after a deploy and an unchanged
re-run): the deploy replays as a no-op, so the CPU it prints is a no-op's. No figure is asserted."""
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_lab_capture_replays_as_a_no_op_and_each_run_is_measured():
    run = subprocess.run([sys.executable, "bench/prepare_cpu.py", "--rounds", "1"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr  # a run that changed something, or failed, exits 1
    out = run.stdout
    deploy = re.search(r"no-op re-deploy \(deploy\.py\)\s+([\d.]+) s", out)
    floor = re.search(r"facts-only \(bench/facts_only\.py\)\s+([\d.]+) s", out)
    assert deploy and floor and float(deploy[1]) > 0 and float(floor[1]) > 0, out
    assert "answered with nothing" not in out, out  # every command the no-op runs is in the capture


def test_a_run_that_changes_something_is_refused(tmp_path):
    """A bundle whose facts no longer match the deploy (here: the head's daemon.json with another sha1)
    does not replay as a no-op, and the tool says so instead of printing a no-op's CPU."""
    import json

    bundle = json.loads((REPO / "tests/unit/fixtures/capture-lab.json").read_text())
    for record in bundle["nodes"]["spark-a"]:
        if record["fact"] == "pyinfra.facts.files.Sha1File" and record["kwargs"].get("path") == "/etc/docker/daemon.json":
            record["stdout"] = ["0" * 40 + "  /etc/docker/daemon.json"]
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(bundle))
    run = subprocess.run([sys.executable, "bench/prepare_cpu.py", str(path), "--rounds", "1"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "did not replay as a no-op" in run.stdout + run.stderr, run.stdout + run.stderr
