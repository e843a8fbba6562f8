"""roles/weights/background.py: the head's fetch as a transient unit, started early, waited for at step 7.

The script, the start and the wait are run here by sh for real; systemd's two programs are stood in for
by small scripts on PATH (systemctl: is-active from a flag file, stop and reset-failed recorded;
systemd-run: its arguments recorded, the flag set). The lab's deploys run them under the real systemd
(tests/e2e: every fresh deploy fetches this way; test_lab_timeouts.py's fetch that never answers).
"""
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from roles.weights import background
from roles.weights.background import (
    FETCH_UNIT, fetch_script, fetch_span, slug, start_command, starts_before_build, wait_command,
)
from sparkfleet import progress
from sparkfleet.config import build_cluster
from sparkfleet.model.serving import load_profile
from tests.unit.helpers import pair

PROFILE = load_profile("glm-5.3-flash-exl3")


def head(tmp_path):
    """The pair's head, its data directory under tmp_path (the config refuses /tmp: copied past it)."""
    return build_cluster(pair()).head.model_copy(update={"preflight_data_dir": str(tmp_path / "data")})


@pytest.fixture
def fake_systemd(tmp_path):
    """PATH with systemctl, systemd-run, journalctl and docker stood in for; returns (env, flag, log)."""
    bin_dir, flag, log = tmp_path / "bin", tmp_path / "active", tmp_path / "calls.log"
    bin_dir.mkdir()
    scripts = {
        "systemctl": f"""#!/bin/sh
echo "systemctl $*" >> {log}
case "$1" in
  is-active) [ -f {flag} ] ;;
  stop) rm -f {flag} ;;
  *) exit 0 ;;
esac
""",
        "systemd-run": f"""#!/bin/sh
echo "systemd-run $*" >> {log}
touch {flag}
""",
        "journalctl": f"""#!/bin/sh
echo "the journal of $*"
""",
        "docker": f"""#!/bin/sh
echo "docker $*" >> {log}
""",
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return env, flag, log


def sh(command: str, env=None, timeout=30) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=timeout)


def test_the_fetch_starts_before_the_build_unless_the_hub_client_needs_the_image_being_built():
    assert starts_before_build("http://mirror/models", image_on_head=False)
    assert starts_before_build("/srv/models", image_on_head=False)
    assert starts_before_build("hub", image_on_head=True)  # the image is on the head already: no build
    assert not starts_before_build("hub", image_on_head=False)


def test_the_script_fetches_each_model_in_turn_and_stops_at_the_first_that_fails(tmp_path, monkeypatch):
    node = head(tmp_path)
    exits = {"org/first": 0, "org/second": 3, "org/third": 0}
    monkeypatch.setattr(background, "fetch_command",
                        lambda node, profile, model, revision: f"echo fetching {model} at {revision}; exit {exits[model]}")
    script = fetch_script(node, PROFILE, [(m, "r1") for m in exits])
    assert script.startswith("#!/bin/sh\n# managed by sparkfleet")
    base = Path(background.fetch_dir(node))
    base.mkdir(parents=True)
    before = time.time()
    run = sh(script)
    assert run.returncode == 3  # the second model's status
    for model, rc in (("org/first", 0), ("org/second", 3)):
        start = float((base / f"{slug(model)}.start").read_text())
        end, status = (base / f"{slug(model)}.end").read_text().split()
        assert before - 1 <= start <= float(end) <= time.time() + 1 and int(status) == rc
        assert (base / f"{slug(model)}.out").read_text() == f"fetching {model} at r1\n"
    assert not (base / f"{slug('org/third')}.start").exists()  # never begun
    assert slug("org/Model v2") == "org--Model-v2"


def test_a_start_runs_the_unit_once_attaches_to_the_same_script_and_replaces_another(tmp_path, fake_systemd, monkeypatch):
    env, flag, log = fake_systemd
    node = head(tmp_path)
    monkeypatch.setattr(background, "fetch_command", lambda node, profile, model, revision: f"echo {model} {revision}")
    first = fetch_script(node, PROFILE, [("org/m", "r1")])
    run = sh(start_command(node, first), env)
    assert run.returncode == 0, run.stderr
    base = Path(background.fetch_dir(node))
    assert (base / "run.sh").read_text() == first
    assert oct(base.stat().st_mode & 0o777) == "0o700" and oct((base / "run.sh").stat().st_mode & 0o777) == "0o700"
    assert log.read_text().count("systemd-run") == 1
    assert f"systemd-run --quiet --collect --unit={FETCH_UNIT}" in log.read_text()
    assert log.read_text().rstrip().endswith(f"/bin/sh {base}/run.sh")

    # The same script while the unit runs (an earlier run stopped before its wait): waited for, not restarted.
    (base / "org--m.start").write_text("1.0\n")
    run = sh(start_command(node, first), env)
    assert run.returncode == 0 and "already fetching" in run.stdout
    assert log.read_text().count("systemd-run") == 1 and "systemctl stop" not in log.read_text()
    assert (base / "org--m.start").exists()

    # Another revision: the running fetch is stopped (its hub container removed), its status cleared, the new one run.
    second = fetch_script(node, PROFILE, [("org/m", "r2")])
    run = sh(start_command(node, second), env)
    assert run.returncode == 0, run.stderr
    calls = log.read_text()
    assert f"systemctl stop {FETCH_UNIT}" in calls and "docker rm -f sparkfleet-weights-fetch" in calls
    assert calls.count("systemd-run") == 2 and (base / "run.sh").read_text() == second
    assert not (base / "org--m.start").exists()


def test_the_wait_ends_with_the_fetch_printing_what_it_printed_and_its_span(tmp_path, fake_systemd):
    env, flag, _ = fake_systemd
    node = head(tmp_path)
    base = Path(background.fetch_dir(node))
    base.mkdir(parents=True)
    flag.touch()  # the unit runs

    def fetch_ends():
        time.sleep(1.5)
        (base / "org--m.start").write_text("100.25\n")
        (base / "org--m.out").write_text('sparkfleet: spark-a: "Fetch org/m" stopped after 5 s, its limit\n')
        (base / "org--m.end").write_text("190.5 124\n")

    thread = threading.Thread(target=fetch_ends)
    thread.start()
    began = time.monotonic()
    run = sh(wait_command(node, "org/m"), env)
    thread.join()
    assert time.monotonic() - began >= 1.4  # it waited for the status, not returned at once
    assert run.returncode == 124
    assert 'stopped after 5 s, its limit' in run.stderr
    assert fetch_span(run.stdout) == (100.25, 190.5, 124)


def test_a_unit_that_ended_without_the_models_status_fails_the_wait_naming_the_unit(tmp_path, fake_systemd):
    env, flag, _ = fake_systemd
    node = head(tmp_path)
    Path(background.fetch_dir(node)).mkdir(parents=True)
    run = sh(wait_command(node, "org/m"), env)  # no flag: the unit is not running, and no .end
    assert run.returncode == 1
    assert f"the background fetch of org/m ({FETCH_UNIT}) ended without finishing it" in run.stderr
    assert f"the journal of -u {FETCH_UNIT}" in run.stderr
    assert fetch_span(run.stdout) is None


def test_the_fetch_is_recorded_as_it_ran_in_place_of_the_wait(monkeypatch):
    monkeypatch.setattr(progress, "SPANS", [progress.Span("spark-a", "Fetch m", 500.0, 510.0, True),
                                           progress.Span("spark-a", "Build", 1.0, 2.0, True)])
    progress.record_span("spark-a", "Fetch m", 100.0, 190.0, False)
    assert progress.SPANS == [progress.Span("spark-a", "Build", 1.0, 2.0, True),
                              progress.Span("spark-a", "Fetch m", 100.0, 190.0, False)]


def test_a_start_removes_the_models_landing_list_only_when_it_starts_the_fetch(tmp_path, fake_systemd, monkeypatch):
    """A worker follows the fetch from the next operation on: an earlier fetch's landing list must be
    gone by then. The manifest stays (a failed fetch leaves the head's copy as it was; a following pull
    reads it only once the list says done). A fetch already running (attached to) keeps its list."""
    env, flag, log = fake_systemd
    node = head(tmp_path).model_copy(update={"weights_dir": str(tmp_path / "models")})
    monkeypatch.setattr(background, "fetch_command", lambda node, profile, model, revision: f"echo {model}")
    stale = [tmp_path / "models" / "org" / name for name in ("m.manifest", "m.landed", "other.manifest")]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# sparkfleet weights manifest v1\n# revision: old\n")
    script = fetch_script(node, PROFILE, [("org/m", "r2")])
    assert sh(start_command(node, script, ["org/m"]), env).returncode == 0
    assert [p.exists() for p in stale] == [True, False, True]
    for path in stale[:2]:
        path.write_text("written by the running fetch\n")
    run = sh(start_command(node, script, ["org/m"]), env)
    assert "already fetching" in run.stdout and all(p.exists() for p in stale)


def test_a_worker_follows_only_the_models_the_head_fetches_in_this_run_and_it_lacks(tmp_path):
    from types import SimpleNamespace

    from roles.weights.background import follow_script, followed
    from roles.weights.checks import FOLLOWS_FETCH
    from sparkfleet.verdicts import WeightsPlan

    cluster = build_cluster(pair())
    worker = cluster.node("spark-b")
    plan = SimpleNamespace(weights=WeightsPlan(
        fetch={"org/m": "no manifest", "org/d": "revision"},
        pull={("org/m", "spark-b"): FOLLOWS_FETCH, ("org/x", "spark-b"): "manifest differs from the head's"}))
    assert followed(plan, cluster, worker, ["org/m", "org/d", "org/x"]) == ["org/m"]
    assert followed(plan, cluster, cluster.head, ["org/m", "org/d", "org/x"]) == []
    script = follow_script(cluster, worker, ["org/m"])
    assert f"sfl_files.py pull http://{cluster.head.fabric_ip}:{cluster.head.fanout_http_port}/org/m" in script
    assert " --follow" in script and f"{background.pull_dir(worker)}/org--m.start" in script
    # Bounded by the fetch's limit and the pull's together: it runs while the head fetches.
    limit = worker.fanout_rsync_timeout_s + cluster.head.weights_fetch_timeout_s
    assert f"timeout --kill-after=" in script and f" {limit} " in script
