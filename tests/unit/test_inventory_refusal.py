"""Bad inventories are refused by `pyinfra` itself, before any SSH connection is attempted.

The hosts point at TCP listeners on loopback (tests/unit/conftest.py) that count connections: a
refusal must come with zero connections, and a valid inventory must reach them (so the probe can
fail). Every class of bad input is in test_bad_input.py.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.unit.helpers import LICENSE_CHOICE, example_site, write_site_data

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def write_inventory(tmp_path, ports, a="", b="", site_data: str | None = LICENSE_CHOICE) -> Path:
    """A site in tmp_path: its inventory of two nodes at the listeners' ports and, unless site_data is
    None, its group_data/all.py (by default the licence choice alone)."""
    if site_data is not None:
        write_site_data(tmp_path, site_data)
    inv = tmp_path / "inventory.py"
    inv.write_text(textwrap.dedent(f"""\
        from sparkfleet.inventory import sparks
        _ssh = {{"ssh_hostname": "127.0.0.1", "ssh_connect_retries": 0}}
        spark_hosts = sparks(
            __file__,
            ("spark-a", {{**_ssh, "ssh_port": {ports[0]}, "rank": 0, "fabric_address": "10.77.77.1/30", "fabric_twin_address": "10.77.78.1/30"{a}}}),
            ("spark-b", {{**_ssh, "ssh_port": {ports[1]}, "rank": 1, "fabric_address": "10.77.77.2/30", "fabric_twin_address": "10.77.78.2/30"{b}}}),
        )
    """))
    return inv


def run_pyinfra(inventory: Path):
    # cwd is the repo: its config.py and group_data/all.py apply, as for a user's deploy.
    return subprocess.run(
        [PYINFRA, "-y", str(inventory), "deploy.py"], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_two_rank_zero_nodes_stop_pyinfra_before_any_connection(tmp_path, listener):
    ports, accepted = listener
    result = run_pyinfra(write_inventory(tmp_path, ports, b=', "rank": 0'))
    assert result.returncode != 0
    assert "spark-a, spark-b: key 'rank' = 0 on 2 nodes" in result.stderr
    assert accepted == []
    assert "Connecting" not in result.stdout + result.stderr


def test_unknown_key_stops_pyinfra_before_any_connection(tmp_path, listener):
    ports, accepted = listener
    result = run_pyinfra(write_inventory(tmp_path, ports, b=', "fabric_mtuu": 9000'))
    assert result.returncode != 0
    assert "spark-b: unknown key 'fabric_mtuu' = 9000" in result.stderr
    assert accepted == []


def test_a_valid_inventory_does_try_to_connect(tmp_path, listener):
    ports, accepted = listener
    result = run_pyinfra(write_inventory(tmp_path, ports))
    assert result.returncode != 0  # the listener is no SSH server
    assert len(accepted) >= 1


def test_config_printer_shows_merged_data_per_host(tmp_path):
    inventory = example_site(tmp_path / "site")  # the tracked example as a user copies it, the choice made
    result = subprocess.run(
        [sys.executable, "-m", "sparkfleet", "config", str(inventory), "--host", "spark-b"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )
    assert result.stdout.startswith("spark-b:\n  name: spark-b\n  rank: 1\n")
    assert "fabric_mtu: 9000" in result.stdout  # from the checkout's group_data/all.py
    assert "fabric_address: 10.77.77.2/30" in result.stdout  # from the inventory
    assert "drafter_license_acknowledged: CC-BY-NC-ND-4.0" in result.stdout  # from the site's group_data/all.py


def test_config_printer_refuses_bad_data(tmp_path):
    inv = write_inventory(tmp_path, [22, 23], a=', "netplan_renderer": "wicked"')
    result = subprocess.run(
        [sys.executable, "-m", "sparkfleet", "config", str(inv)], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 1  # sparkfleet/exit_codes.py: refused input; 2 is only a plan's changes
    assert "spark-a: key 'netplan_renderer' = 'wicked'" in result.stderr


def test_lab_inventory_takes_the_lab_group_data_and_the_renderer_the_lab_runs(tmp_path):
    def config(state):
        return subprocess.run(
            [sys.executable, "-m", "sparkfleet", "config", "lab/inventory.py"],
            cwd=REPO, capture_output=True, text=True, check=True, env={**os.environ, "SFL_LAB_STATE": str(state)},
        ).stdout

    fresh = config(tmp_path)  # no lab state: the lab's default, as DGX OS
    assert fresh.count("netplan_renderer: NetworkManager") == 2 and "gpu_expected: false" in fresh
    (tmp_path / "run").mkdir()
    for host in ("spark-a", "spark-b"):  # what `SFL_LAB_RENDERER=networkd lab.sh up` leaves (a file per host)
        (tmp_path / "run" / f"renderer-{host}").write_text("networkd\n")
    assert config(tmp_path).count("netplan_renderer: networkd") == 2
