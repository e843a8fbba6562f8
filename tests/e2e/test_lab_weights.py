"""Weights fetched once and fanned out, kernel caches warmed and identical on every rank, in the lab.

The lab's models (lab/model) come from the bridge over HTTP; the stand-in engine writes JIT cache
entries per request shape, different on each rank, so the merge is real. A fan-out cut mid-transfer
says its five parts (the worker, the step, the command that shows its pull log, the key, the next
step). Runs after the serving tests (same lab, pair deployed).
"""
import re
import subprocess
import time

import pytest

from sparkfleet.model.serving import load_profile
from roles.weights.background import FETCH_UNIT, START_STEP as FETCH_START_STEP
from tests.e2e.lab import BIN, INVENTORY, REPO, Run, deploy, fabric_rx_bytes, management_address, on, plan, \
    read_failure_log, state_checks
from tests.e2e.lab import run as run_cmd
from tests.e2e.plan_conformance import operations_mismatches

pytestmark = pytest.mark.lab

PROFILE = load_profile("glm-5.3-flash-exl3")
MODEL = PROFILE.model
WEIGHTS = f"/var/lib/sparkfleet/models/{MODEL}"
CACHE = "/var/lib/sparkfleet/kernel-cache"


def cache_files(host: str) -> list[str]:
    return sorted(on(host, f"cd {CACHE}/current/ && find . -type f | sort").split())


def moved(*extra: str) -> tuple[Run, int]:
    """A deploy, and the bytes spark-b received on its fabric netdev meanwhile."""
    rx = fabric_rx_bytes("spark-b")
    run = deploy(*extra)
    return run, fabric_rx_bytes("spark-b") - rx


@pytest.fixture(scope="module", autouse=True)
def serving_pair():
    run, rx = moved()
    assert run.returncode == 0, run.output
    yield run, rx


def test_weights_and_caches_are_in_place_and_a_second_deploy_moves_nothing(serving_pair):
    checks = state_checks("tests/state/test_weights_and_caches.py")
    assert checks.returncode == 0, checks.output
    # The module's own deploy is that second deploy when it changed nothing (the modules before this
    # one left the pair deployed, as in `make test`): another would prove the same again. Alone after a
    # lab reset, it brought the pair up, and a second deploy runs here.
    run, rx = serving_pair if serving_pair[0].changed() == [] else moved()
    assert run.returncode == 0, run.output
    assert run.changed() == []  # nothing fetched, sent or re-warmed
    assert "every node's copy matches the head's manifest" in run.output
    assert re.search(r"kernel caches \([^)]*\): generation [0-9a-f]{12}-[0-9a-f]{8} identical on every rank", run.output)
    assert rx < 1024 * 1024  # a few SSH-free fabric packets at most


def test_each_rank_compiled_its_own_kernels_and_holds_the_union():
    a, b = cache_files("spark-a"), cache_files("spark-b")
    assert a == b and len(a) > 10
    # The stand-in names an entry by (cache, shape, rank): each rank compiled its own, both hold both.
    ranks = {int(x) for x in re.findall(r'"rank": ?(\d)', on("spark-b", f"cat $(find {CACHE}/current/triton -type f)"))}
    assert ranks == {0, 1}


def test_a_deleted_cache_file_fails_the_checks_naming_it_and_is_restored_without_a_prewarm():
    victim = on("spark-b", f"cd {CACHE}/current && find triton -type f | sort | head -1").strip()
    on("spark-b", f"rm {CACHE}/current/{victim}")
    checks = state_checks("tests/state/test_weights_and_caches.py")
    assert checks.returncode != 0
    assert f"missing {victim}" in checks.output, checks.output
    doctor = run_cmd([str(BIN / "pyinfra"), "-y", INVENTORY, "doctor.py"])
    assert doctor.returncode != 0 and f"spark-b: 1 file(s) missing or resized: {victim}" in doctor.output, doctor.output
    # The doctor's plan row and `sparkfleet plan` say the same: the next deploy syncs spark-b's caches.
    assert re.search(r"^plan\s+pair\s+FAIL a deploy would warm the kernel caches \(sync spark-b\)$", doctor.output, re.M)
    planned = plan()
    assert planned.returncode == 2, planned.output
    assert "  pair: warm the kernel caches (sync spark-b)\n" in planned.output
    run = deploy()
    assert run.returncode == 0, run.output
    assert operations_mismatches(planned.output, run.changed()) == [], planned.output
    assert "repair without prewarm: spark-b: 1 file(s) missing or resized" in run.output
    assert ("Bring the kernel caches in line with the head's", "spark-a") in run.changed()
    assert "warm-up round" not in run.output and "prewarm of generation" not in run.output
    assert not [op for op, _ in run.changed() if op.startswith(("Restart", "Start", "Stop"))]  # serving untouched
    assert on("spark-b", f"test -f {CACHE}/current/{victim} && echo ok").strip() == "ok"
    assert state_checks("tests/state/test_weights_and_caches.py").returncode == 0


def test_a_shortfall_of_disk_stops_the_fetch_with_the_numbers_before_any_byte_moves():
    drafter = PROFILE.speculative.draft_model
    on("spark-a", f"rm -rf /var/lib/sparkfleet/models/{drafter} /var/lib/sparkfleet/models/{drafter}.manifest")
    refused = deploy("--data", "weights_free_margin_gib=100000")
    assert refused.returncode != 0
    assert re.search(r"not enough disk under /var/lib/sparkfleet/models/incoai: [0-9.]+ GiB to fetch \+ 100000\.00 GiB "
                     r"margin, [0-9.]+ GiB free; nothing was transferred", refused.output), refused.output
    assert on("spark-a", f"ls /var/lib/sparkfleet/models/{drafter} 2>/dev/null | wc -l").strip() == "0"
    run = deploy()
    assert run.returncode == 0, run.output
    revision = PROFILE.speculative.draft_model_revision
    assert (f"Fetch {drafter} at {revision} on the head (http://198.18.0.1:8089)", "spark-a") in run.changed()
    # The fetch ran in the background (roles/weights/background.py): started before the image step, as a
    # transient unit now gone, its status beside its script on the head: ended with status 0.
    names = [op for op, _ in run.changed()]
    assert names.index(FETCH_START_STEP) < names.index(f"Fetch {drafter} at {revision} on the head (http://198.18.0.1:8089)")
    assert on("spark-a", f"systemctl is-active {FETCH_UNIT}", check=False).strip() == "inactive"
    status = f"/var/lib/sparkfleet/weights-fetch/{drafter.replace('/', '--')}"
    started, (ended, code) = float(on("spark-a", f"cat {status}.start")), on("spark-a", f"cat {status}.end").split()
    assert started <= float(ended) and code == "0"


def test_an_interrupted_fan_out_resumes_instead_of_restarting():
    # A slow link (fanout_bwlimit_kib) makes the transfer long enough to kill halfway.
    on("spark-b", f"rm -rf {WEIGHTS} {WEIGHTS}.manifest")
    total = int(on("spark-a", f"du -sb --apparent-size {WEIGHTS} | cut -f1"))
    slow = ("--data", "fanout_bwlimit_kib=2048")
    cmd = [str(BIN / "pyinfra"), "-y", INVENTORY, "deploy.py", *slow]
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        partial = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and partial < total // 3:
            time.sleep(0.5)
            out = on("spark-b", f"du -sb --apparent-size {WEIGHTS} 2>/dev/null | cut -f1", check=False).strip()
            partial = int(out or 0)
        assert total // 3 <= partial < total, f"fan-out never got a third in: {partial} of {total} bytes"
        on("spark-b", "pkill -TERM -f '^python3 [^ ]*sfl_files.py pull' || true")  # the pull (not its shell, not this one)
        output, _ = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode != 0, output
    # The cut pull's five parts, in the one line it printed on the worker.
    cut = Run(first.returncode, output).failure("spark-b", "fanout_http_port", form="line")
    assert cut.waited_for == f'"Send {MODEL} to the workers over the fabric"'
    assert cut.what.startswith("failed (exit status ") and not cut.what.startswith("failed (exit status 0)"), cut
    pull_log = f"/var/lib/sparkfleet/logs/weights-pull-{MODEL.replace('/', '--')}.log"
    assert cut.log == f"ssh root@{management_address('spark-b')} 'tail -n 200 {pull_log}'", cut.log
    assert "answers on 198.19.77.1:8874" in cut.next_step, cut.next_step  # the head's HTTP server, on the fabric
    assert f"(ssh root@{management_address('spark-a')} 'systemctl status sparkfleet-fanout-http')" in cut.next_step
    assert cut.next_step.endswith("a re-run resumes from what arrived"), cut.next_step
    assert read_failure_log(cut).splitlines()[-1].endswith(f"; next: {cut.next_step}")  # the log ends with the line
    assert "stays paused" not in output  # the fan-out comes before the watchdogs are paused (step 7c)
    kept = int(on("spark-b", f"du -sb --apparent-size {WEIGHTS} | cut -f1"))
    assert kept >= total // 3, f"the interrupted transfer kept only {kept} bytes"

    rx = fabric_rx_bytes("spark-b")
    run = deploy()
    assert run.returncode == 0, run.output
    assert (f"Send {MODEL} to the workers over the fabric", "spark-b") in run.changed()
    sent = fabric_rx_bytes("spark-b") - rx
    print(f"fan-out resumed: {total} bytes in the model, {kept} kept by the interrupted pull, {sent} crossed the fabric")
    # Resumed: what crossed is what was missing (a Range from each partial file), not the whole model again.
    assert sent < total - kept // 2, f"{sent} bytes crossed for {total - kept} missing of {total}"
    assert state_checks("tests/state/test_weights_and_caches.py").returncode == 0
    assert deploy().changed() == []


def test_old_cache_generations_go_past_the_retention_count():
    # The serving tests bumped the recipe and rolled back: two generations on each node.
    current = on("spark-a", f"readlink {CACHE}/current").strip()
    gens = lambda host: sorted(on(host, f"find {CACHE} -mindepth 1 -maxdepth 1 -type d -printf '%f\\n'").split())
    assert len(gens("spark-a")) >= 2 and current in gens("spark-a")
    # Not generations sparkfleet made: an operator's directory, and 12 hex digits without a manifest.
    foreign = ("operator-notes", "deadbeef0000")
    on("spark-b", " && ".join(f"mkdir -p {CACHE}/{d} && touch {CACHE}/{d}/keep" for d in foreign))
    try:
        run = deploy("--data", "kernel_cache_keep_generations=1")
        assert run.returncode == 0, run.output
        assert ("Bring the kernel caches in line with the head's", "spark-a") in run.changed()
        assert gens("spark-a") == [current] and gens("spark-b") == sorted([current, *foreign])
        assert on("spark-b", f"ls {CACHE}/*.manifest").split() == [f"{CACHE}/{current}.manifest"]
        assert deploy().changed() == []
    finally:
        on("spark-b", f"rm -rf {' '.join(f'{CACHE}/{d}' for d in foreign)}")


def test_a_hub_token_file_others_can_read_is_refused_before_anything_changes():
    on("spark-a", "umask 022 && echo hf_not_a_real_token > /etc/sparkfleet/hf-token")  # 0644
    try:
        run = deploy("--data", "weights_source=hub")
        assert run.returncode != 0
        assert ("spark-a: weights_hf_token_file /etc/sparkfleet/hf-token is owned by root with mode 0644; "
                "it must be root-only") in run.output, run.output
        assert run.results() == [] and "hf_not_a_real_token" not in run.output
    finally:
        on("spark-a", "rm -f /etc/sparkfleet/hf-token")
