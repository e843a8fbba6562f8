"""The give-up drill, on the lab's stand-in pair: a fault no restart can cure (the worker's image gone,
its pinned digest unobtainable) must end with the watchdog giving up and `make doctor` failing with the
reason, and a deploy repairs it. The drills a restart cures (each rank killed and frozen, a reboot, a
power cut, a worker dying during the start-up) run against the real vLLM: tests/real/test_real_watchdog.py.
This one stays on the stand-in because its repair deploy ships the whole image again (3 GB for the
real engine, a few MB here) and it proves the watchdog's own give-up logic, which no engine decides.

Runs on any lab (its fixture deploys the pair: on `make test`'s fresh lab, after
tests/e2e/test_lab_first_pair.py brought it up through the README's path).
"""
import json
import time
from types import SimpleNamespace

import pytest

from sparkfleet.model.engine import image_pin_path
from tests.e2e.drills import HEAD, UNITS, WORKER, signal_engine, wait_journal, wait_serving, watchdog_journal
from tests.e2e.lab import BIN, INVENTORY, deploy, on, run

pytestmark = pytest.mark.lab

@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run_ = deploy()
    assert run_.returncode == 0, run_.output
    wait_serving(time.monotonic())
    yield


def report(capsys, line):
    with capsys.disabled():
        print(f"\n  drill {line}")


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


def test_a_full_disk_leaves_the_watchdog_watching_and_saying_why_it_cannot_save(capsys):
    """The head's watchdog state directory on a 16 KiB tmpfs holding the state it had, the rest filled:
    every save fails (ENOSPC) and the watchdog says so once, keeps running (systemd never restarts it:
    no crash loop; its peers read the last state it saved), and says its state is saved again as soon
    as there is room. The directory's own filesystem is never filled: the lab's hosts
    share this machine's disk."""
    state_dir = "/var/lib/sparkfleet/watchdog"
    restarts = on(HEAD, "systemctl show -P NRestarts sparkfleet-watchdog").strip()
    pid = on(HEAD, "systemctl show -P MainPID sparkfleet-watchdog").strip()
    since = time.time()
    on(HEAD, f"cp -a {state_dir}/state.json /run/sfl-state.json && mount -t tmpfs -o size=16k,mode=0700 tmpfs "
             f"{state_dir} && cp -a /run/sfl-state.json {state_dir}/state.json && "
             f"(dd if=/dev/zero of={state_dir}/filler bs=1k 2>/dev/null || true) && df -k {state_dir}")
    try:
        full = wait_journal(HEAD, since, "cannot save its state", timeout=60)
        assert f"cannot save its state to {state_dir}/state.json: No space left on device" in full, full
        # A time on purpose (docs/lab.md, Waits): what is proven is that nothing happens (no crash loop,
        # no restart) over three probes of the lab's watchdog (every 5 s), and a failed save leaves no
        # state to count them by.
        time.sleep(15)
        assert on(HEAD, "systemctl is-active sparkfleet-watchdog").strip() == "active"
        assert on(HEAD, "systemctl show -P MainPID sparkfleet-watchdog").strip() == pid
        assert on(HEAD, "systemctl show -P NRestarts sparkfleet-watchdog").strip() == restarts
        journal = watchdog_journal(HEAD, since)
        assert journal.count("cannot save its state") == 1, journal  # said once, not at every probe
        assert "internal error" not in journal and "probing sparkfleet-head every" not in journal, journal
        # The file stays as it was saved last: the `status` command, which reads it, sees it grow stale.
        saved = json.loads(on(HEAD, f"cat {state_dir}/state.json"))
        assert time.time() - saved["updated_epoch"] >= 15
    finally:
        on(HEAD, f"umount {state_dir}; rm -f /run/sfl-state.json")
    wait_journal(HEAD, since, "its state is saved again", timeout=60)
    assert time.time() - json.loads(on(HEAD, f"cat {state_dir}/state.json"))["updated_epoch"] < 15
    assert on(HEAD, "systemctl show -P NRestarts sparkfleet-watchdog").strip() == restarts
    report(capsys, "(full disk) the head's watchdog could not save for 15 s+, said so once, kept running and "
                   "saved again once there was room")
