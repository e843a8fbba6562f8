"""Guards on the lab: a bring-up that cannot fit in memory is refused in seconds, with the numbers.

Runs after test_lab_fabric.py, whose deploys leave the pair serving.
"""
import re

import pytest

from tests.e2e.lab import deploy, on

pytestmark = pytest.mark.lab


def test_memory_admission_refuses_a_bring_up_that_does_not_fit_and_changes_nothing():
    # A bring-up: no engine running on either rank.
    on("spark-a", "systemctl stop sparkfleet-head")
    on("spark-b", "systemctl stop sparkfleet-worker")
    # Lab-sized numbers: utilization 0.79 of the lab's MemTotal fits; 64 GiB of headroom on top cannot.
    run = deploy("--data", "guard_min_headroom_gib=64")
    assert run.returncode != 0
    assert "guards refused the deploy, nothing was changed" in run.output
    for host in ("spark-a", "spark-b"):
        m = re.search(rf"memory: 0\.79 x ([0-9.]+) GiB = ([0-9.]+) GiB needed \+ 64\.00 GiB headroom, ([0-9.]+) GiB free on {host}", run.output)
        assert m, run.output
        assert abs(0.79 * float(m[1]) - float(m[2])) < 0.01
    assert run.results() == []  # refused at prepare: no operation ran

    # Without the headroom the same bring-up fits, and the pair serves again.
    run = deploy()
    assert run.returncode == 0, run.output
    assert "fits" in run.output
    assert '"id": "glm-5.3-flash"' in on("spark-a", "curl -fsS -m 10 http://127.0.0.1:8000/v1/models")
