"""Exact recipe drift on the lab: recipe v3's launcher passes an engine flag (--max-num-seqs 64)
that no launch default shows. A bump to v3 builds the image, runs the launcher in it with the
engine replaced by a recorder, and stops naming the flag before anything is shipped; adopted in
data (serving_extra_args) the same bump proceeds and the pair serves v3 with the flag.

Runs after test_lab_profiles.py, or alone after `make lab-reset` (the module's first deploy
brings the pair up); it leaves the pair serving v1 as the inventory's data says.
"""
import pytest

from tests.e2e.lab import REPO, deploy, models_command, on, running_tag
from tests.e2e.plan_conformance import starts_in_background

pytestmark = pytest.mark.lab

COMMITS = dict(line.split() for line in (REPO / "lab/recipe/COMMITS").read_text().splitlines() if line.strip())
IMAGE = "sparkfleet/glm-5.3-flash-exl3"
# v2 (under v3) flips KV_SLOTMAP_PIN, which nothing pins: acknowledged here, so that the stop below
# is exact drift's alone (test_lab_serving.py covers pinning it). Acknowledged, not pinned, the
# rendered files stay v1's: only the commit and the adopted flag change.
ACK = ("--data", 'recipe_drift_acknowledged=["KV_SLOTMAP_PIN"]')
ADOPT = ("--data", 'serving_extra_args=["--max-num-seqs","64"]')


def models() -> str:
    return on("spark-a", models_command())


def container(host: str, unit: str, what: str) -> str:
    return on(host, f"docker inspect --format '{{{{{what}}}}}' {unit}").strip()


@pytest.fixture(scope="module", autouse=True)
def serving_v1():
    run = deploy()
    assert run.returncode == 0, run.output
    yield
    # v3 -> v1 is a bump too (KV_SLOTMAP_PIN 1 -> 0, acknowledged); the units lose the adopted flag.
    back = deploy(*ACK)
    assert back.returncode == 0, back.output
    assert running_tag("spark-a", "sparkfleet-head") == f"{IMAGE}:{COMMITS['v1']}"
    plain = deploy()
    assert plain.returncode == 0 and plain.changed() == [], plain.output


def test_a_bump_to_v3_stops_on_the_launchers_new_flag_until_it_is_adopted():
    v1, v3 = COMMITS["v1"], COMMITS["v3"]
    bump = ("--data", f"serving_recipe_commit={v3}", *ACK)
    for host in ("spark-a", "spark-b"):  # a lab used before: v3 is built and shipped again
        on(host, f"docker image rm {IMAGE}:{v3} 198.19.77.1:5000/{IMAGE}:{v3} >/dev/null 2>&1 || true")

    stopped = deploy(*bump)
    assert stopped.returncode != 0
    assert "KV_SLOTMAP_PIN: 0 -> 1 (not pinned; acknowledged in recipe_drift_acknowledged)" in stopped.output
    assert (f"exact recipe drift at {v3[:12]}: the recipe's launcher start.sh (run in {IMAGE}:{v3} with the "
            f"engine replaced by a recorder) differs from what sparkfleet renders: --max-num-seqs 64: the recipe "
            f"passes it, sparkfleet does not. To go on: adopt it (data: serving_extra_args: "
            f"[\"--max-num-seqs\", \"64\"], or the profile's extra_args) or acknowledge (recipe_drift_acknowledged: "
            f"[\"--max-num-seqs=64\"]). {IMAGE}:{v3} is built on the head; nothing was pushed or restarted."
            ) in stopped.output, stopped.output
    assert "--max-num-seqs 64: the recipe passes it, sparkfleet does not [every rank] (NOT adopted)" in stopped.output
    # The variable the launcher exports is seen too; acknowledged, it is reported and does not stop.
    assert ("KV_SLOTMAP_PIN: the launcher sets 1, sparkfleet does not [every rank] (acknowledged in "
            "recipe_drift_acknowledged)") in stopped.output
    changed = stopped.changed()
    assert (f"Build {IMAGE}:{v3} on the head", "spark-a") in changed
    assert not [op for op, _ in changed if op.startswith(("Push", "Pull", "Restart", "Start", "Stop"))
                and not starts_in_background(op)], changed  # the build's start (step 2d) is no start of the pair
    assert running_tag("spark-b", "sparkfleet-worker") == f"{IMAGE}:{v1}"
    assert '"id": "glm-5.3-flash"' in models()  # the pair still serves v1

    # Adopted in data: the launcher's flag is now sparkfleet's too, the same bump ships and serves.
    run = deploy(*bump, *ADOPT)
    assert run.returncode == 0, run.output
    assert (f"recipe {v3[:12]}, exact drift (start.sh in {IMAGE}:{v3}, the engine recorded per rank): "
            f"KV_SLOTMAP_PIN: the launcher sets 1, sparkfleet does not [every rank] (acknowledged in "
            f"recipe_drift_acknowledged)\n") in run.output, run.output
    changed = run.changed()
    assert (f"Build {IMAGE}:{v3} on the head", "spark-a") not in changed  # built by the stopped run
    assert (f"Pull {IMAGE}:{v3} from the head", "spark-b") in changed
    for host, unit in (("spark-a", "sparkfleet-head"), ("spark-b", "sparkfleet-worker")):
        assert running_tag(host, unit) == f"{IMAGE}:{v3}"
        assert '"--max-num-seqs","64"' in container(host, unit, "json .Config.Cmd")
    assert '"id": "glm-5.3-flash"' in models()
    again = deploy(*bump, *ADOPT)
    assert again.returncode == 0 and again.changed() == [], again.output
