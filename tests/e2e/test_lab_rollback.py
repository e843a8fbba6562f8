"""Rollback means the last good commit, on the lab: a bump to v2 whose prewarm fails leaves v1
serving (the kernel caches linked back, the units restarted worker-first, /health awaited) and the
deploy fails naming the prewarm; `make rollback` (rollback.py) then returns to v1, the commit that
served last, with nothing rebuilt; after v2 did serve, rollback returns to v1 as well. The failed
prewarm says its five parts (the rank, the wait, the command that shows the rank's kept prewarm log,
the key, the next step), and the watchdogs it paused watch the restored pair again.

Runs alone after `make lab-reset` (its first deploy brings the pair up) or after the other lab
modules; it leaves the pair serving v1 as the inventory's data says.
"""
import re

import pytest

from tests.e2e.lab import BIN, HOSTS, INVENTORY, REPO, deploy, models_command, on, read_failure_log, run, running_tag
from tests.e2e.plan_conformance import starts_in_background

pytestmark = pytest.mark.lab

COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if line.strip())
V1, V2 = COMMITS["v1"], COMMITS["v2"]
IMAGE = "sparkfleet/glm-5.3-flash-exl3"
HISTORY = "/var/lib/sparkfleet/recipes/glm-5.3-flash-exl3.history"
# v2 flips KV_SLOTMAP_PIN, which nothing pins (test_lab_serving.py covers pinning it): acknowledged,
# so the rendered files stay v1's and only the commit changes (as in test_lab_recipe_drift.py).
ACK = ("--data", 'recipe_drift_acknowledged=["KV_SLOTMAP_PIN"]')
BUMP = ("--data", f"serving_recipe_commit={V2}", *ACK)
# A legitimate prewarm failure: an environment value the engine refuses, so the new pair exits
# before it is up (the lab stand-in refuses a SFL_STANDIN_JIT_MS that is not a number).
ENGINE_EXITS = ("--data", 'serving_env_pins={"SFL_STANDIN_JIT_MS": "soon"}')


def rollback(*extra):
    return run([str(BIN / "pyinfra"), "-y", INVENTORY, "rollback.py", *extra])


def models() -> str:
    return on("spark-a", models_command())


def generation_of(host: str, commit: str) -> str:
    """The first half of the commit's kernel-cache generation name (12 hex digits of its image ID);
    the second is the compile key of the rendered settings (roles/kernel_cache/checks.py generation)."""
    return on(host, f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}:{commit}").strip().removeprefix("sha256:")[:12]


def keyed(image_part: str) -> str:
    """A generation name of that image, whatever its compile key, as a regular expression."""
    return re.escape(image_part) + "-[0-9a-f]{8}"


def current(host: str) -> str:
    return on(host, "readlink /var/lib/sparkfleet/kernel-cache/current").strip()


def events() -> list[tuple[str, str]]:
    """(event, commit) of every line of the head's history."""
    return [tuple(line.split()[1:3]) for line in on("spark-a", f"cat {HISTORY} 2>/dev/null || true").splitlines()]


def serves(commit: str) -> None:
    assert running_tag("spark-a", "sparkfleet-head") == f"{IMAGE}:{commit}"
    assert running_tag("spark-b", "sparkfleet-worker") == f"{IMAGE}:{commit}"
    for host, unit in (("spark-a", "sparkfleet-head"), ("spark-b", "sparkfleet-worker")):
        assert on(host, f"systemctl is-active {unit}").strip() == "active"
        assert re.fullmatch(keyed(generation_of(host, commit)), current(host)), current(host)
    assert '"id": "glm-5.3-flash"' in models()


def remove_v2_images():
    for host in ("spark-a", "spark-b"):
        on(host, f"docker image rm {IMAGE}:{V2} 198.19.77.1:5000/{IMAGE}:{V2} >/dev/null 2>&1 || true")


@pytest.fixture(scope="module", autouse=True)
def serving_v1():
    first = deploy(*ACK)  # from a lab left on v2, v2 -> v1 is a bump (KV_SLOTMAP_PIN 1 -> 0, acknowledged)
    assert first.returncode == 0, first.output
    serves(V1)
    yield
    # The tests end rolled back to v1, where a plain deploy has nothing to do: that deploy alone, then.
    # A test that stopped on v2 leaves a bump a plain deploy refuses (KV_SLOTMAP_PIN 1 -> 0), or
    # something to change: v1 again, acknowledged, and the plain deploy once more.
    plain = deploy()
    if plain.returncode != 0 or plain.changed():
        back = deploy(*ACK)
        assert back.returncode == 0, back.output
        plain = deploy()
    assert plain.returncode == 0 and plain.changed() == [], plain.output
    serves(V1)
    remove_v2_images()  # test_lab_serving.py builds and ships v2 itself


def test_a_failed_prewarm_leaves_v1_serving_and_rollback_stays_there():
    remove_v2_images()  # a lab used before: v2 is built, shipped and warmed again
    seen = len(events())

    failed = deploy(*BUMP, *ENGINE_EXITS)
    assert failed.returncode != 0
    out = failed.output
    assert re.search(f"the prewarm of kernel-cache generation {keyed(generation_of('spark-a', V2))} "
                     + re.escape(f"({IMAGE}:{V2}) failed"), out), out
    assert "the prewarm engine stopped" in out, out
    # The five parts: the rank whose engine exited (either may be seen first), the wait, the command
    # that shows that rank's prewarm log (kept before its container was removed), the key, the next step.
    [stopped] = [f for f in failed.failures() if f.form == "block"]
    assert stopped.host in HOSTS and stopped.key == "serving_profile", stopped
    assert "failed: the prewarm engine stopped (" in stopped.what and stopped.what.endswith("before the pair was up")
    assert stopped.waited_for == "the prewarm pair's /health to answer 200 (up to 120 s)"  # the lab's timeout
    assert stopped.log.endswith(" 'tail -n 200 /var/lib/sparkfleet/logs/prewarm.log'"), stopped.log
    assert "fix it in the profile (serving_profile) or the node, then re-deploy" in stopped.next_step
    assert "SFL_STANDIN_JIT_MS" in read_failure_log(stopped)  # the engine's own refusal, on that rank
    # The watchdogs this run paused (step 7c) watch the restored pair again: no note says they stay paused.
    assert "sparkfleet-watchdog watches it again on spark-b, spark-a" in out and "stays paused" not in out, out
    for host in HOSTS:
        assert on(host, "systemctl is-active sparkfleet-watchdog", check=False).strip() == "active", host
    assert re.search(re.escape(f"The previous production is serving again: {IMAGE}:{V1} (recipe {V1}) on kernel-cache generation ")
                     + keyed(generation_of('spark-a', V1)) + re.escape("; restarted spark-b then spark-a; /health 200"), out), out
    assert "Traceback" not in out
    ops = failed.changed()
    assert (f"Build {IMAGE}:{V2} on the head", "spark-a") in ops
    assert not [op for op, _ in ops  # the worker's pull of v2 started (step 5) is no start of the pair
                if op.startswith(("Restart", "Start", "Stop", "Record the attempted", "Record the served"))
                and not starts_in_background(op)], ops
    serves(V1)  # both containers on v1's image, 'current' back at v1's generation, the API answers
    v2_generation = generation_of("spark-a", V2)
    for host in ("spark-a", "spark-b"):
        assert on(host, "docker ps -aq --filter name=sparkfleet-prewarm").strip() == ""
        # The generation the failed run created is gone again (never warmed, never sealed).
        assert on(host, f"ls -d /var/lib/sparkfleet/kernel-cache/{v2_generation}* 2>/dev/null || true").strip() == ""
    assert events()[seen:] == [("attempted", V2), ("failed", V2), ("served", V1)]

    # make rollback: data still names v2; the commit that served last other than v2 is v1.
    back = rollback(*BUMP)
    assert back.returncode == 0, back.output
    assert f"recipe {V2} -> {V1}" in back.output
    # (v2 may have served in this lab before: test_lab_serving.py; then .deployed says so, untimed.)
    assert f"from {V2[:12]} (what data names: last attempted " in back.output and ", last failed " in back.output
    assert f'set serving_recipe_commit = "{V1}" in data' in back.output
    assert not [op for op, _ in back.changed() if op.startswith(("Build", "Pull", "Push", "Prewarm", "Restart",
                                                                   "Start", "Stop"))], back.output
    serves(V1)


def test_after_v2_served_rollback_returns_to_v1():
    # A re-run of the same bump repairs: v2 (built and shipped by the failed run) is warmed and served.
    up = deploy(*BUMP)
    assert up.returncode == 0, up.output
    assert ("Prewarm and merge the kernel caches", "spark-a") in up.changed()
    assert not [op for op, _ in up.changed() if op.startswith(("Build", "Pull"))], up.output
    serves(V2)
    assert events()[-2:] == [("attempted", V2), ("served", V2)]

    back = rollback(*BUMP)
    assert back.returncode == 0, back.output
    assert f"recipe {V2} -> {V1}" in back.output and "last served" in back.output
    ops = back.changed()
    assert not [op for op, _ in ops if op.startswith(("Build", "Pull", "Push", "Prewarm"))], back.output
    assert ("Restart the workers (workers first)", "spark-b") in ops
    serves(V1)
    assert events()[-2:] == [("attempted", V1), ("served", V1)]
    # Once more changes nothing: v1 is still the commit that served last other than the one data names.
    again = rollback(*BUMP)
    assert again.returncode == 0 and again.changed() == [], again.output
