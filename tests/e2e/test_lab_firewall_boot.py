"""roles/firewall between deploys, in the lab: a restart or reload of nftables.service (which flushes
the whole ruleset) leaves the table inet sparkfleet in place without a deploy, `nft flush ruleset` is
a red doctor row naming the missing table until a deploy puts it back, and every unit that listens
starts after the firewall and not at all when it cannot load (a real boot of spark-a with a rules
file nft refuses).

Each test leaves the lab deployed and healthy, also when it fails (a deploy in `finally`).
"""
import re
import time

import pytest

from tests.e2e.lab import BIN, INVENTORY, deploy, on, pause_watchdogs, reboot, run, state_checks

pytestmark = pytest.mark.lab

TABLE = "inet sparkfleet"
FIREWALL = "sparkfleet-firewall.service"
APPLY = "Apply the nftables table inet sparkfleet (one transaction)"
RULES = "/etc/sparkfleet/firewall.nft"  # <serving_dir>/firewall.nft, the lab's serving_dir the default
# Every unit that listens, per lab host: the rsync daemon, the weights' HTTP server, the head's registry,
# each rank's engine.
LISTENING = {
    "spark-a": ("sparkfleet-rsyncd.service", "sparkfleet-fanout-http.service", "docker-registry.service",
                "sparkfleet-head.service", "sparkfleet-api-proxy.service"),
    "spark-b": ("sparkfleet-rsyncd.service", "sparkfleet-fanout-http.service", "sparkfleet-worker.service"),
}
PORTS = {"spark-a": (873, 8874, 5000, 8000, 18000), "spark-b": (873, 8874)}


@pytest.fixture(scope="module", autouse=True)
def deployed_pair():
    result = deploy()
    assert result.returncode == 0, result.output
    yield


def redeploy():
    result = deploy()
    assert result.returncode == 0, result.output
    return result


def doctor():
    return run([str(BIN / "pyinfra"), "-y", INVENTORY, "doctor.py"])


def marker(host: str) -> str:
    found = re.findall(r"sparkfleet [0-9a-f]{40}", on(host, f"nft list table {TABLE} 2>/dev/null || true"))
    return found[0] if found else ""


def wait_for_table(host: str, seconds: float = 10) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = marker(host)
        if found:
            return found
        time.sleep(0.2)
    return ""


def other_tables(host: str) -> str:
    """Every table but sparkfleet's, as `nft -f` takes them back (Docker's own among them)."""
    tables = [line.split(None, 1)[1] for line in on(host, "nft list tables").splitlines()
              if line.startswith("table ") and line.split(None, 1)[1] != TABLE]
    return "".join(on(host, f"nft list table {t}") for t in tables)


def started_at(host: str, unit: str) -> str:
    return on(host, f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").strip()


def test_a_restart_or_reload_of_nftables_leaves_the_table_in_place_without_a_deploy():
    want = marker("spark-a")
    assert want, "the deploy left no table inet sparkfleet on spark-a"
    head_since = started_at("spark-a", "sparkfleet-head.service")
    try:
        for action in ("restart", "reload"):
            # A table of the operator's: nftables.service's `flush ruleset` removes it (the flush is real).
            on("spark-a", "nft add table inet sfl_probe")
            on("spark-a", f"systemctl {action} nftables.service")
            assert "sfl_probe" not in on("spark-a", "nft list tables"), f"{action}: nftables.service flushed nothing"
            assert wait_for_table("spark-a", 10) == want, f"{action} of nftables.service: the table is not back"
        # Nothing that requires the firewall was restarted with it: the pair served throughout.
        assert started_at("spark-a", "sparkfleet-head.service") == head_since
        checks = state_checks("-k", "firewall")
        assert checks.returncode == 0, checks.output
    finally:
        on("spark-a", "nft delete table inet sfl_probe 2>/dev/null || true", check=False)
    # A deploy after it has nothing to apply.
    result = redeploy()
    assert (APPLY, "spark-a") not in result.changed(), result.output


def test_a_flushed_ruleset_is_a_red_doctor_row_naming_the_table_until_a_deploy_puts_it_back():
    saved = other_tables("spark-a")
    try:
        on("spark-a", "nft flush ruleset")
        # Docker's own tables back at once (only sparkfleet's stays missing): the lab keeps serving.
        on("spark-a", f"nft -f - <<'EOF'\n{saved}EOF")
        assert marker("spark-a") == ""
        result = doctor()
        assert result.returncode != 0, result.output
        assert (f"firewall    spark-a    FAIL spark-a: the nftables table {TABLE} is missing") in result.output
        assert re.search(r"^firewall    spark-b    ok", result.output, re.M), result.output
        assert result.results() == []  # read-only
        assert marker("spark-a") == ""
        fixed = redeploy()
        assert (APPLY, "spark-a") in fixed.changed() and (APPLY, "spark-b") not in fixed.changed()
        again = doctor()
        assert again.returncode == 0, again.output
        assert re.search(r"^firewall    spark-a    ok", again.output, re.M), again.output
    finally:
        if not marker("spark-a"):
            redeploy()


def test_every_listening_unit_starts_after_the_firewall_and_not_at_all_when_it_cannot_load():
    for host, units in LISTENING.items():
        for unit in units:
            shown = dict(line.split("=", 1) for line in on(
                host, f"systemctl show -p After -p Requires -p BindsTo {unit}").splitlines() if "=" in line)
            assert FIREWALL in shown["After"].split(), f"{host}: {unit} After={shown['After']}"
            assert FIREWALL in shown["Requires"].split(), f"{host}: {unit} Requires={shown['Requires']}"
    pause_watchdogs()  # the watchdogs would start the pair again under the test
    try:
        # A rules file nft refuses, then a real boot of spark-a: its firewall unit fails, and nothing that
        # requires it starts; no port of the fabric's services or the API listens.
        on("spark-a", f"echo 'this is not nft' >> {RULES}")
        reboot("spark-a")
        assert on("spark-a", f"systemctl is-active {FIREWALL}", check=False).strip() == "failed"
        assert marker("spark-a") == ""
        for unit in LISTENING["spark-a"]:
            state = on("spark-a", f"systemctl is-active {unit}", check=False).strip()
            assert state == "inactive", f"spark-a: {unit} is {state} without its firewall"
        listening = on("spark-a", "ss -Hltn").split()
        assert not [p for p in PORTS["spark-a"] if any(w.endswith(f":{p}") for w in listening)], listening
        # A start by hand (or the watchdog's restart) is refused the same way: the firewall is started
        # first, fails again, and the unit is not started.
        started = on("spark-a", "systemctl start sparkfleet-rsyncd.service 2>&1; echo rc=$?", check=False)
        assert "A dependency job for sparkfleet-rsyncd.service failed" in started and "rc=0" not in started, started
        assert on("spark-a", "systemctl is-active sparkfleet-rsyncd.service", check=False).strip() == "inactive"
        # The same on a running node: a firewall unit stopped stops every unit that requires it.
        on("spark-b", f"systemctl stop {FIREWALL}")
        for unit in LISTENING["spark-b"]:
            state = on("spark-b", f"systemctl is-active {unit}", check=False).strip()
            assert state == "inactive", f"spark-b: {unit} is {state} after its firewall unit stopped"
    finally:
        redeploy()  # the rules file rewritten, the table loaded, every unit started again
    for host, units in LISTENING.items():
        assert on(host, f"systemctl is-active {FIREWALL} {' '.join(units)}").split() == ["active"] * (len(units) + 1)
    assert doctor().returncode == 0
