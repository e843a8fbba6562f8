"""The lab's pair behind the router (router_node: spark-a): a fleet of one routed group. A change
that restarts the pair would drain the last group the router routes for its model: the run is
refused before any change, naming the group (roles/rolling/routes.py), and the router keeps
routing to it; the doctor and status each have a router row. The router is removed at the end
(a deploy without router_node), so the other modules find the pair as they expect it."""
import re

import pytest

from tests.e2e.lab import BIN, INVENTORY, deploy, on, run

pytestmark = pytest.mark.lab

ROUTED = ("--data", "router_node=spark-a")
URL = "https://198.18.0.11:8000"  # the pair's head as the router names it (TLS: smg verifies it with the fleet CA)


def routing() -> str:
    return on("spark-a", "python3 /usr/local/libexec/sparkfleet/sfl_router.py routing /etc/sparkfleet/router.json")


@pytest.fixture(scope="module", autouse=True)
def pair_behind_the_router():
    first = deploy(*ROUTED)
    assert first.returncode == 0, first.output[-4000:]
    assert f'"state": "routed", "status": "ready", "url": "{URL}"' in routing()
    yield
    removed = deploy()
    assert removed.returncode == 0, removed.output[-4000:]
    assert on("spark-a", "systemctl is-active sparkfleet-router", check=False).strip() != "active"


def test_the_last_routed_group_is_not_drained_for_a_restart_and_the_run_changes_nothing():
    change = ("--data", 'serving_env_pins={"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "1799"}')  # restarts the pair
    refused = deploy(*ROUTED, *change)
    assert refused.returncode != 0, refused.output[-4000:]
    assert "--> sparkfleet router on spark-a: pair routed" in refused.output, refused.output[-4000:]
    assert "a turn would take the last routed group of a model out of the router; nothing was changed" in refused.output
    assert ("spark-a: serving group pair is the last group the router routes for model 'glm-5.3-flash' (the only "
            "group serving it)") in refused.output
    assert "router_outage_accepted: true (allowed: true, false)" in refused.output
    assert refused.results() == [] and "Traceback" not in refused.output, refused.output[-4000:]
    assert f'"state": "routed", "status": "ready", "url": "{URL}"' in routing()
    assert "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=1799" not in on("spark-a", "cat /etc/sparkfleet/sparkfleet-head.env")


def test_the_doctor_and_status_show_the_router_row():
    doctor = run([str(BIN / "pyinfra"), "-y", INVENTORY, "doctor.py", *ROUTED])
    assert doctor.returncode == 0, doctor.output[-4000:]
    assert "--> sparkfleet doctor router on spark-a (read-only):" in doctor.output
    assert re.search(rf"^router\s+pair\s+ok \({re.escape(URL)} routed\)$", doctor.output, re.M), doctor.output[-3000:]
    status = run([str(BIN / "pyinfra"), "-y", INVENTORY, "status.py", *ROUTED])
    assert status.returncode == 0, status.output[-4000:]
    assert re.search(rf"^  pair\s+{re.escape(URL)}\s+routed$", status.output, re.M), status.output[-3000:]
