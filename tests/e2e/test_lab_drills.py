"""Keep the pair serving, drilled on the lab: each fault of issue 13's list is injected into a serving
pair, and the pair must serve a chat completion again within RECOVERY_BOUND_S with no deploy run; the
watchdog's journal must say what it saw and did; a deploy afterwards must change nothing. A fault no
restart can cure (the worker's image gone, its pinned digest unobtainable) must end with the watchdog giving up and `make doctor`
failing with the reason. Each time to recover is printed.

Runs first on a fresh lab (its fixture deploys the pair), or on any deployed lab.
"""
import time
from types import SimpleNamespace

import pytest

from roles.serving.engine import image_pin_path
from tests.e2e.drills import DRILLS, HEAD, RECOVERY_BOUND_S, UNITS, WORKER, run_drill, signal_engine, wait_serving, \
    wait_journal, wait_watchdog_settled, watchdog_journal
from tests.e2e.lab import BIN, INVENTORY, deploy, on, run

pytestmark = pytest.mark.lab

# What the head's watchdog must have seen in a failed probe for each drill.
SAW = {
    "a": "spark-b",  # its container gone, or restarted alone by systemd (a new head cannot use it)
    "b": "spark-b: sparkfleet-worker: process",  # ... stopped (SIGSTOP): the rank makes no progress
    "c": "sparkfleet-head",  # the head's container gone or restarted alone
}


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run_ = deploy()
    assert run_.returncode == 0, run_.output
    wait_serving(time.monotonic())
    yield


def report(capsys, line):
    with capsys.disabled():
        print(f"\n  drill {line}")


@pytest.mark.parametrize("key", ["a", "b", "c"])
def test_a_dead_or_frozen_rank_is_restarted_as_a_pair_by_the_watchdog(key, capsys):
    took, since = run_drill(key)
    report(capsys, f"({key}) {DRILLS[key].what}: serving again after {took:.1f} s (bound {RECOVERY_BOUND_S} s)")
    head = wait_journal(HEAD, since, "the pair serves again after")
    assert [line for line in head.splitlines() if "probe failed" in line and SAW[key] in line], head
    assert "restarting the pair" in head, head
    worker = watchdog_journal(WORKER, since)
    assert "restarts the pair (generation" in worker and "container running after" in worker, worker
    if key == "b":
        assert "killed container sparkfleet-worker" in worker, worker  # never docker stop's 60 s wait
    wait_watchdog_settled()  # a restart of its own still running would be the deploy's change
    run_ = deploy()
    assert run_.returncode == 0 and run_.changed() == [], run_.output


@pytest.mark.parametrize("key", ["d", "e"])
def test_after_a_reboot_or_a_power_cut_the_pair_serves_again_without_a_deploy(key, capsys):
    took, since = run_drill(key)
    report(capsys, f"({key}) {DRILLS[key].what}: serving again after {took:.1f} s, the boot included "
                   f"(bound {RECOVERY_BOUND_S} s)")
    for host in (HEAD, WORKER):
        assert on(host, "systemctl is-enabled sparkfleet-watchdog " + UNITS[host]).split() == ["enabled", "enabled"]
    # Whether the ranks met by themselves or the watchdog restarted them, the journal says which.
    head = wait_journal(HEAD, since, "probe ok", "the pair serves again after")
    wait_watchdog_settled()  # a restart of its own still running would be the deploy's change
    run_ = deploy()
    assert run_.returncode == 0 and run_.changed() == [], run_.output


def test_a_pair_that_cannot_come_back_is_given_up_on_and_the_doctor_says_why(capsys):
    since = time.time()
    # The worker runs the head's registry digest and would pull it again (roles/image): its image is
    # removed and its pin names a manifest the registry does not have, so no restart can start it.
    image = on(WORKER, "docker inspect -f '{{.Image}}' sparkfleet-worker").strip()
    pin = image_pin_path(SimpleNamespace(serving_dir="/etc/sparkfleet", is_head=False))
    on(WORKER, f"docker rmi -f {image} >/dev/null; "  # the running container keeps its layers
               f"sed -i 's/@sha256:[0-9a-f]*/@sha256:{'0' * 64}/' {pin} && grep -q '@sha256:{'0' * 64}' {pin}")
    start = time.monotonic()
    signal_engine(WORKER, "KILL")
    wait_journal(HEAD, since, "GAVE UP", timeout=300)
    report(capsys, f"(give-up) the worker's image removed and unobtainable: the watchdog gave up after {time.monotonic() - start:.1f} s")
    head = watchdog_journal(HEAD, since)
    assert "a worker's unit did not start (spark-b: sparkfleet-worker exited with status" in head, head
    wait_journal(WORKER, since, "gave up at", timeout=30)  # the worker stops its unit too
    for host in (HEAD, WORKER):  # the units are left stopped
        assert on(host, f"systemctl is-active {UNITS[host]}", check=False).strip() in ("inactive", "failed")

    doctor = run([str(BIN / "pyinfra"), "-y", INVENTORY, "doctor.py"])
    assert doctor.returncode != 0, doctor.output
    assert "GAVE UP" in doctor.output and "did not keep the pair serving" in doctor.output, doctor.output

    # A deploy repairs it (the image shipped again, the pair restarted, the give-up cleared).
    repaired = deploy()
    assert repaired.returncode == 0, repaired.output
    wait_serving(time.monotonic(), 60)
    assert deploy().changed() == []
