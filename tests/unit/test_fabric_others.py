"""Other configurations of the fabric netdev: found from the fact's raw output, named, and taken
over only where that cannot break another link."""
import base64
import os
import shlex
import subprocess
import sys
from pathlib import Path

from sparkfleet.fabric_others import (
    FabricConfigs, conflict_failures, networkd_others, netplan_others, other_configs,
    parse_fabric_configs, renderer_in_effect,
)
from sparkfleet.model.fabric import NETPLAN_FILE
from sparkfleet.config import build_cluster
from tools.doctor import netconfig_row
from tests.unit.helpers import pair

NETDEV = "enp1s0f0np0"
MAC = "d2:9e:e3:1c:13:f7"
RECORDED = Path(__file__).parent / "fixtures" / "fabric_configs_nm_lab.txt"


def recorded() -> dict:
    return parse_fabric_configs(RECORDED.read_text().splitlines())


def node(take_over=False, name="spark-b"):
    return build_cluster(pair(**{name: {"fabric_take_over": take_over}})).node(name)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# --- the recorded lab host (NetworkManager, after a deploy, other configurations planted) ----------

def test_the_recorded_host_gives_its_netdev_units_and_connections():
    facts = recorded()
    assert facts["mac"] == MAC and facts["kind"] == "veth"
    assert facts["units"]["NetworkManager"] == {"active": "active", "enabled": "enabled"}
    assert renderer_in_effect(facts) == "NetworkManager and systemd-networkd active"  # netplan apply starts networkd
    names = {c["connection.id"] for c in facts["nm"].values()}
    assert {"netplan-enp1s0f0np0", "cx7 by hand", "cx7:mac", "Wired connection 1", "sfl-lab-host0"} <= names
    assert NETPLAN_FILE in facts["netplan"]


def test_every_planted_configuration_is_found_and_nothing_else():
    found = {(c.kind, c.where.split(" (")[0]): c for c in other_configs(recorded(), NETDEV)}
    assert set(found) == {
        ("netplan", "/etc/netplan/40-cx7.yaml"),
        ("NetworkManager", "connection 'cx7:mac'"),
        ("networkd", "/etc/systemd/network/30-cx7.network"),
        ("networkd", "/etc/systemd/network/90-all-en.network"),
    }
    # Not found: sparkfleet's own file and what netplan generates from it, NetworkManager's own
    # "Wired connection 1" default, a connection with autoconnect off that is not up, the lab's
    # host0 files, systemd's shipped container files (they match other names).
    assert "addresses 192.168.100.12/24" in found[("netplan", "/etc/netplan/40-cx7.yaml")].detail
    assert f"mac-address {MAC}" in found[("NetworkManager", "connection 'cx7:mac'")].detail


def test_what_can_be_taken_over_and_what_cannot():
    found = {c.where.split(" (")[0]: c for c in other_configs(recorded(), NETDEV)}
    cx7 = found["/etc/netplan/40-cx7.yaml"]
    assert cx7.takeover.startswith("cp -p --backup=numbered /etc/netplan/40-cx7.yaml /etc/netplan/40-cx7.yaml.sparkfleet-orig")
    assert "rewritten without enp1s0f0np0" in cx7.action  # its sibling enP2p1s0f0np0 stays configured
    assert "connection.autoconnect no" in found["connection 'cx7:mac'"].takeover
    assert found["/etc/systemd/network/30-cx7.network"].takeover.startswith(
        "mv --backup=numbered /etc/systemd/network/30-cx7.network /etc/systemd/network/30-cx7.network.sparkfleet-disabled")
    everything = found["/etc/systemd/network/90-all-en.network"]
    assert everything.takeover is None and "may cover other links too" in everything.why_not


def test_preflight_names_the_host_the_file_and_what_to_do():
    failures = conflict_failures(node(), other_configs(recorded(), NETDEV))
    assert len(failures) == 4
    first = failures[0]
    assert first.startswith("spark-b: enp1s0f0np0 is also configured by netplan /etc/netplan/40-cx7.yaml")
    assert "set fabric_take_over = true" in first and "40-cx7.yaml.sparkfleet-orig" in first


def test_with_the_take_over_only_what_it_cannot_disable_still_stops_the_deploy():
    failures = conflict_failures(node(take_over=True), other_configs(recorded(), NETDEV))
    assert failures == [
        "spark-b: enp1s0f0np0 is also configured by networkd /etc/systemd/network/90-all-en.network: matches it "
        "([Match] Name=en*); fabric_take_over cannot disable it: its [Match] may cover other links too; make it "
        "name only the ones it means, by hand"
    ]


def test_the_doctor_reports_the_renderer_and_every_other_configuration():
    facts = recorded()
    problems, note = netconfig_row(node(), facts, other_configs(facts, NETDEV))
    assert len(problems) == 4 and all(p.startswith("spark-b: enp1s0f0np0 is also configured by ") for p in problems)
    assert note.startswith("renderer NetworkManager (NetworkManager")
    wrong = build_cluster(pair(**{"spark-b": {"netplan_renderer": "networkd"}})).node("spark-b")
    facts["units"]["systemd-networkd"]["active"] = "inactive"
    problems, _ = netconfig_row(wrong, facts, [])
    assert problems == ["spark-b: netplan_renderer is networkd, but systemd-networkd is not active"]


# --- netplan files ----------------------------------------------------------------------------

def test_a_file_for_the_fabric_alone_is_renamed_aside():
    files = {"/etc/netplan/40-cx7.yaml": f"network:\n  version: 2\n  ethernets:\n    {NETDEV}:\n      mtu: 1500\n"}
    [c] = netplan_others(files, NETDEV, MAC)
    assert c.takeover == "mv --backup=numbered /etc/netplan/40-cx7.yaml /etc/netplan/40-cx7.yaml.sparkfleet-disabled"
    assert "mtu 1500" in c.detail


def test_a_stanza_that_matches_by_mac_or_by_exact_name_binds_the_netdev():
    by_mac = f"network:\n  ethernets:\n    cx7:\n      match:\n        macaddress: \"{MAC.upper()}\"\n      dhcp4: true\n"
    by_name = f"network:\n  ethernets:\n    cx7:\n      match:\n        name: {NETDEV}\n"
    other_mac = "network:\n  ethernets:\n    cx7:\n      match:\n        macaddress: 00:11:22:33:44:55\n"
    assert netplan_others({"/etc/netplan/a.yaml": by_mac}, NETDEV, MAC)[0].takeover
    assert netplan_others({"/etc/netplan/b.yaml": by_name}, NETDEV, MAC)[0].takeover
    assert netplan_others({"/etc/netplan/c.yaml": other_mac}, NETDEV, MAC) == []


def test_a_glob_a_bond_a_file_outside_etc_or_broken_yaml_is_named_but_never_taken_over():
    cases = {
        "/etc/netplan/glob.yaml": "network:\n  ethernets:\n    all-en:\n      match:\n        name: en*\n      dhcp4: true\n",
        "/etc/netplan/bond.yaml": (f"network:\n  ethernets:\n    {NETDEV}: {{}}\n    eth1: {{}}\n"
                                   f"  bonds:\n    bond0:\n      interfaces: [{NETDEV}, eth1]\n"),
        "/run/netplan/cloud.yaml": f"network:\n  ethernets:\n    {NETDEV}:\n      dhcp4: true\n",
        "/etc/netplan/broken.yaml": "network: [\n",
    }
    found = {c.where: c for c in netplan_others(cases, NETDEV, MAC)}
    assert set(found) == set(cases)
    assert all(c.takeover is None and c.why_not for c in found.values())
    assert "bonds.bond0" in found["/etc/netplan/bond.yaml"].detail
    assert "not valid YAML" in found["/etc/netplan/broken.yaml"].detail


def test_same_named_files_hide_each_other_and_sparkfleets_own_file_is_not_another():
    text = f"network:\n  ethernets:\n    {NETDEV}:\n      dhcp4: true\n"
    hidden = {"/run/netplan/40-cx7.yaml": "network: {version: 2}\n", "/etc/netplan/40-cx7.yaml": text}
    assert netplan_others(hidden, NETDEV, MAC) == []  # /run/netplan comes first
    assert netplan_others({NETPLAN_FILE: text}, NETDEV, MAC) == []


def test_the_rewrite_keeps_the_other_netdevs_and_the_original(tmp_path):
    path = tmp_path / "40-cx7.yaml"
    original = (f"# by hand\nnetwork:\n  version: 2\n  ethernets:\n    {NETDEV}:\n      addresses: [192.168.100.12/24]\n"
                "    enP2p1s0f0np0:\n      addresses: [192.168.101.12/24]\n")
    path.write_text(original)
    path.chmod(0o600)
    [c] = netplan_others({f"/etc/netplan/{path.name}": original}, NETDEV, MAC)
    # The take-over's own command, on a copy under tmp_path, with this interpreter's PyYAML.
    command = c.takeover.replace(f"/etc/netplan/{path.name}", shlex.quote(str(path))).replace(" python3 -c ", f" {sys.executable} -c ")
    subprocess.run(["sh", "-c", command], check=True)
    subprocess.run(["sh", "-c", command], check=True)  # a second run keeps the first original (~1~)
    import yaml

    doc = yaml.safe_load(path.read_text())
    assert list(doc["network"]["ethernets"]) == ["enP2p1s0f0np0"]
    assert path.read_text().startswith("# sparkfleet (fabric_take_over) removed enp1s0f0np0")
    assert (tmp_path / "40-cx7.yaml.sparkfleet-orig.~1~").read_text() == original
    assert oct(path.stat().st_mode & 0o777) == "0o600"


# --- systemd-networkd files -------------------------------------------------------------------

def test_networkd_match_lists_negation_masks_and_shipped_files():
    files = {
        "/etc/systemd/network/10-not-en.network": b64("[Match]\nName=!en*\n"),
        "/etc/systemd/network/20-mac.network": b64(f"[Match]\nMACAddress={MAC.upper()}\n"),
        "/usr/lib/systemd/network/30-cx7.network": b64(f"[Match]\nName={NETDEV}\n"),
        "/usr/lib/systemd/network/40-masked.network": b64(f"[Match]\nName={NETDEV}\n"),
        "/etc/systemd/network/40-masked.network": None,  # -> /dev/null
        "/usr/lib/systemd/network/80-wifi-adhoc.network": b64("[Match]\nType=wlan\nWLANInterfaceType=ad-hoc\n"),
        "/usr/lib/systemd/network/80-container-host0.network": b64("[Match]\nVirtualization=container\nName=host0\n"),
        "/run/systemd/network/10-netplan-enp1s0f0np0.network": b64(f"[Match]\nName={NETDEV}\n"),
        "/etc/systemd/network/99-every-link.network": b64("[Network]\nDHCP=yes\n"),
    }
    decoded = {p: (base64.b64decode(t).decode() if t else None) for p, t in files.items()}
    found = {c.where: c for c in networkd_others(decoded, NETDEV, MAC, "")}
    assert set(found) == {"/etc/systemd/network/20-mac.network", "/usr/lib/systemd/network/30-cx7.network",
                          "/etc/systemd/network/99-every-link.network"}
    assert found["/usr/lib/systemd/network/30-cx7.network"].takeover.startswith(
        "ln -sfn /dev/null /etc/systemd/network/30-cx7.network")
    assert found["/etc/systemd/network/99-every-link.network"].takeover is None
    assert "no [Match] (every link)" in found["/etc/systemd/network/99-every-link.network"].detail


# --- the fact itself, run for real -------------------------------------------------------------

def test_the_fact_command_runs_and_parses_on_this_machine():
    out = subprocess.run(["sh", "-c", FabricConfigs().command("sfl-no-such0")], capture_output=True, text=True,
                         env={**os.environ, "LC_ALL": "C"})
    assert out.returncode == 0, out.stderr
    facts = parse_fabric_configs(out.stdout.splitlines())
    assert facts["mac"] == "" and set(facts["units"]) == {"NetworkManager", "systemd-networkd"}
