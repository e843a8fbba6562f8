"""roles/image/background.py: a worker's pull as a transient unit, started after the head's push and
waited for at step 7d, and the head's build, started at step 2d and waited for at step 5. Each job (the bounded pull by digest, the tag, the pin) is run here by sh for real,
`docker` stood in for by a script on PATH; the unit's start and wait are sparkfleet/background.py's,
run by tests/unit/test_weights_background.py; the lab's deploys run all of it under the real systemd and
Docker (tests/e2e: every fresh deploy ships the image this way)."""
import os
import subprocess
from pathlib import Path

from roles.image.background import JOB, pull_dir, pull_job
from sparkfleet import background
from sparkfleet.config import build_cluster
from sparkfleet.model.engine import image_pin_path
from tests.unit.helpers import pair

REF = "10.77.77.1:5000/sparkfleet/glm@sha256:" + "1" * 64


def worker(tmp_path):
    """The pair's worker, its directories under tmp_path (the config refuses /tmp: copied past it)."""
    return build_cluster(pair()).nodes[1].model_copy(
        update={"serving_dir": str(tmp_path / "serving"), "preflight_data_dir": str(tmp_path / "data")})


def run_job(tmp_path, pull_exit: int) -> tuple[subprocess.CompletedProcess, Path, str]:
    node = worker(tmp_path)
    bin_dir, calls = tmp_path / "bin", tmp_path / "docker.log"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "docker $*" >> {calls}\n'
                                    f'[ "$1" = pull ] && {{ echo "pulling $2"; exit {pull_exit}; }}\nexit 0\n')
    (bin_dir / "docker").chmod(0o755)
    base = Path(pull_dir(node))
    base.mkdir(parents=True)
    script = background.job_script("test", [(JOB, pull_job(node, REF, "sparkfleet/glm:c"))], str(base))
    run = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return run, base, image_pin_path(node)


def test_a_pull_that_lands_tags_the_image_then_pins_the_unit_to_its_digest(tmp_path):
    run, base, pin = run_job(tmp_path, pull_exit=0)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "docker.log").read_text().splitlines() == [f"docker pull {REF}", f"docker tag {REF} sparkfleet/glm:c"]
    assert Path(pin).read_text() == f"SPARKFLEET_IMAGE={REF}\n"
    assert oct((tmp_path / "serving").stat().st_mode & 0o777) == "0o700"  # made by the job on a first deploy
    assert (base / "pull.end").read_text().split()[1] == "0" and f"pulling {REF}" in (base / "pull.out").read_text()


def test_a_failed_pull_writes_no_pin_and_leaves_its_status_and_reason_for_the_wait(tmp_path):
    run, base, pin = run_job(tmp_path, pull_exit=1)
    assert run.returncode == 1
    assert not Path(pin).exists()  # a pin names only an image the node holds
    assert "docker tag" not in (tmp_path / "docker.log").read_text()
    assert (base / "pull.end").read_text().split()[1] == "1"
    out = (base / "pull.out").read_text()
    assert 'sparkfleet: spark-b: "Pull sparkfleet/glm-5.3-flash-exl3:' in out and "failed (exit status 1)" in out
    assert "key: docker_registry_port" in out



# --- the head's build (deploy.py step 2d, waited for at step 5) ------------------------------------

def run_build(tmp_path, build_exit: int) -> tuple[subprocess.CompletedProcess, Path, object]:
    """The build's job exactly as start_build gives it to the unit (roles/image/commands.py build_command:
    bounded, its log on the head), `docker` a script on PATH that records the call and exits build_exit."""
    from roles.image.background import BUILD_JOB, build_dir
    from roles.image.commands import build_command
    from sparkfleet.model.serving import node_profile

    head = build_cluster(pair()).nodes[0].model_copy(update={"preflight_data_dir": str(tmp_path / "data")})
    profile = node_profile(head)
    bin_dir, calls, src = tmp_path / "bin", tmp_path / "docker.log", tmp_path / "recipe"
    bin_dir.mkdir()
    src.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "docker $*" >> {calls}\necho "step 3/7 failed" >&2\nexit {build_exit}\n')
    (bin_dir / "docker").chmod(0o755)
    base = Path(build_dir(head))
    base.mkdir(parents=True)
    script = background.job_script("test", [(BUILD_JOB, build_command(head, profile, str(src)))], str(base))
    run = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return run, base, profile


def test_the_background_build_runs_the_bounded_build_in_the_recipe_and_ends_its_job(tmp_path):
    run, base, profile = run_build(tmp_path, build_exit=0)
    assert run.returncode == 0, run.stderr
    call = (tmp_path / "docker.log").read_text()
    assert call.startswith("docker build --quiet -f ") and f" -t {profile.image_ref} " in call
    assert (base / "build.end").read_text().split()[1] == "0" and (base / "build.start").exists()


def test_a_failed_background_build_leaves_the_builds_own_lines_for_the_wait(tmp_path):
    """What step 5's wait prints when the build failed: the lines the foreground build printed (the step,
    its exit status, the log on the head, the data key), the exit status in its end file."""
    run, base, profile = run_build(tmp_path, build_exit=3)
    assert run.returncode == 3
    assert (base / "build.end").read_text().split()[1] == "3"
    out = (base / "build.out").read_text()
    assert f'sparkfleet: spark-a: "Build {profile.image_ref} on the head": failed (exit status 3)' in out, out
    assert "key: serving_recipe_commit" in out and "/data/logs/build-" in out, out
