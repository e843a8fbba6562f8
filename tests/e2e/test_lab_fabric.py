"""The lab end to end: deploy the fabric from nothing, prove idempotence, catch and repair drift.

Runs against the two lab hosts (`make lab-up`); the tests run in order and share the lab.
"""
import pytest

from roles.fabric.schema import NETPLAN_FILE
from tests.e2e.lab import HOSTS, deploy, on, pause_watchdogs, state_checks

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module", autouse=True)
def unconfigured_fabric():
    """Start from the fabric a fresh node has: no drop-in, no address, MTU 1500, link down."""
    pause_watchdogs()  # a pair left serving by an earlier module must not be repaired under this one
    for h in HOSTS:
        on(h, f"rm -f {NETPLAN_FILE} && netplan apply && ip addr flush dev enp1s0f0np0 && "
              "ip link set enp1s0f0np0 mtu 1500 down")
    yield


def test_state_checks_fail_before_the_deploy():
    checks = state_checks()
    assert checks.returncode != 0
    assert "spark-a" in checks.output and "spark-b" in checks.output


def test_first_deploy_configures_and_proves_the_fabric():
    run = deploy()
    assert run.returncode == 0, run.output
    changed = set(run.changed())
    for h in HOSTS:
        assert ("Write the fabric netplan drop-in", h) in changed
        assert ("Apply netplan (fabric file or live link changed)", h) in changed
        assert ("Prove jumbo frames to every peer", h) in changed
    assert "sparkfleet preflight" in run.output


def test_state_checks_pass_after_the_deploy():
    checks = state_checks()
    assert checks.returncode == 0, checks.output


def test_second_deploy_changes_nothing():
    run = deploy()
    assert run.returncode == 0, run.output
    assert run.results(), run.output  # operations did run and report
    assert run.changed() == [], run.output


def test_mtu_set_by_hand_is_caught_by_state_checks_and_repaired_by_a_deploy():
    on("spark-b", "ip link set enp1s0f0np0 mtu 1500")
    checks = state_checks()
    assert checks.returncode != 0
    failed = [l.split()[1] for l in checks.output.splitlines() if l.startswith("FAILED")]
    mtu_check = "test_fabric_netdev_is_up_with_the_inventory_address_and_mtu"
    assert f"tests/state/test_fabric.py::{mtu_check}[ssh://spark-b]" in failed, checks.output
    assert f"tests/state/test_fabric.py::{mtu_check}[ssh://spark-a]" not in failed, checks.output
    assert "spark-b: enp1s0f0np0 mtu 1500, want 9000" in checks.output
    # spark-a's own settings are right, but its jumbo pings to spark-b now fail too, naming spark-b.
    assert "spark-a -> spark-b (198.19.77.2)" in checks.output

    run = deploy()
    assert run.returncode == 0, run.output
    assert ("Apply netplan (fabric file or live link changed)", "spark-b") in run.changed()
    assert ("Apply netplan (fabric file or live link changed)", "spark-a") not in run.changed()
    assert state_checks().returncode == 0
    assert deploy().changed() == []


def test_a_peer_that_drops_jumbo_frames_stops_the_deploy_naming_both_ends():
    rule = "INPUT -i enp1s0f0np0 -p icmp -m length --length 1500:65535 -j DROP"
    on("spark-b", f"iptables -I {rule}")
    try:
        run = deploy()
    finally:
        on("spark-b", f"iptables -D {rule}")
    assert run.returncode != 0
    assert "fabric: spark-a (enp1s0f0np0 mtu 9000) cannot reach spark-b at 198.19.77.2 (enp1s0f0np0 mtu 9000)" in run.output
    assert run.changed() == []


def test_preflight_failure_stops_the_deploy_before_any_change():
    run = deploy("--data", "preflight_min_mem_total_gib=100000")
    assert run.returncode != 0
    assert "preflight failed, nothing was changed" in run.output
    assert "spark-a: MemTotal" in run.output and "spark-b: MemTotal" in run.output
    assert run.results() == []
