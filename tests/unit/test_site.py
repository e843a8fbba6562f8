"""The site directory (docs/configuration.md): the user's inventory, group_data/ and profiles/ outside the
checkout's tracked files, read by every command as pyinfra reads it, after the shipped defaults; and the
drafter licence, which the shipped defaults accept for no one and a site must choose.

A site here is a copy of the tracked site.example/, as a user makes theirs. Read through the CLI's own
path (sparkfleet.__main__) and through `pyinfra -y SITE/inventory.py deploy.py` from the checkout, its
nodes pointed at loopback listeners that count connections (tests/unit/conftest.py); and through the
checkout's inventory.py, the site's front ($SPARKFLEET_SITE, else <checkout>/site), in both ways."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkfleet.__main__ import main, validated
from sparkfleet.inventory import SITE_VARIABLE, load_inventory
from sparkfleet.exit_codes import FAILED, OK
from sparkfleet.model.serving import PROFILES_DIR, load_profile, node_profile, profile_names
from tests.unit.helpers import SITE_EXAMPLE, example_site, run_pyinfra, write_site_data
from tests.unit.test_inventory_refusal import write_inventory

REPO = Path(__file__).resolve().parents[2]
SHIPPED = "glm-5.3-flash-exl3"


def site_profile(site: Path, name: str, **changes) -> Path:
    """The shipped profile SHIPPED copied into the site's profiles/ as NAME.yaml, with `changes`."""
    data = yaml.safe_load((PROFILES_DIR / f"{SHIPPED}.yaml").read_text())
    data.update(name=name, **changes)
    path = site / "profiles" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ------------------------------------------------------------------------------ the licence choice

def test_the_shipped_defaults_acknowledge_no_licence():
    import runpy

    assert runpy.run_path(str(REPO / "group_data" / "all.py"))["drafter_license_acknowledged"] is None


def test_a_site_that_has_not_chosen_is_refused_naming_host_key_licence_and_allowed_values(tmp_path, capsys):
    inventory = example_site(tmp_path / "site", choice="")  # the example as copied: the choice left to the user
    assert main(["config", str(inventory)]) == FAILED
    err = capsys.readouterr().err
    assert "refused before connecting to any host" in err
    assert "spark-a: key 'drafter_license_acknowledged' = None" in err
    assert "CC-BY-NC-ND-4.0 (non-commercial use only, no derivatives)" in err
    assert "Allowed: drafter_license_acknowledged: CC-BY-NC-ND-4.0" in err and "deployment_purpose: production" in err
    assert f"do:   make the choice in {tmp_path / 'site' / 'group_data' / 'all.py'}" in err


def test_a_wrong_spelling_of_the_licence_is_no_choice(tmp_path, capsys):
    inventory = example_site(tmp_path / "site", choice='drafter_license_acknowledged = "CC-BY-4.0"\n')
    assert main(["config", str(inventory)]) == FAILED
    assert "key 'drafter_license_acknowledged' = 'CC-BY-4.0'" in capsys.readouterr().err


def test_the_choice_made_in_the_site_is_taken(tmp_path, capsys):
    inventory = example_site(tmp_path / "site")
    assert main(["config", str(inventory), "--host", "spark-a"]) == OK
    out = yaml.safe_load(capsys.readouterr().out)["spark-a"]
    assert out["drafter_license_acknowledged"] == "CC-BY-NC-ND-4.0" and out["serving_site"] == str(tmp_path / "site")


def test_production_with_the_mtp_profile_needs_no_acknowledgement(tmp_path):
    inventory = example_site(tmp_path / "site", choice='deployment_purpose = "production"\n'
                                                       'serving_profile = "glm-5.3-flash-exl3-mtp"\n')
    cluster = validated(str(inventory))
    assert cluster is not None and cluster.head.drafter_license_acknowledged is None


def test_the_lab_makes_its_own_choice():
    cluster = validated("lab/inventory.py")
    assert cluster is not None and cluster.head.drafter_license_acknowledged == "CC-BY-NC-ND-4.0"


# ---------------------------------------------------------------- the site's data, through the CLI

def test_the_cli_reads_the_sites_group_data_after_the_shipped_defaults(tmp_path):
    inventory = example_site(tmp_path / "site", choice='drafter_license_acknowledged = "CC-BY-NC-ND-4.0"\n'
                                                       "serving_health_timeout_s = 900\n")
    cluster = validated(str(inventory))
    assert cluster.head.serving_health_timeout_s == 900  # the site's, over the model's 1200
    assert cluster.head.fabric_netdev == "enp1s0f0np0"  # the checkout's group_data/all.py still under it
    assert cluster.head.deployment_purpose == "research"


def test_a_sites_profile_replaces_the_shipped_one_of_that_name(tmp_path):
    inventory = example_site(tmp_path / "site")
    shipped_port = node_profile(validated(str(inventory)).head).port
    site_profile(tmp_path / "site", SHIPPED, port=shipped_port + 1)
    assert node_profile(validated(str(inventory)).head).port == shipped_port + 1


def test_a_sites_own_profile_is_served_by_name_and_listed(tmp_path, capsys):
    inventory = example_site(tmp_path / "site", choice='drafter_license_acknowledged = "CC-BY-NC-ND-4.0"\n'
                                                       'serving_profile = "ours"\n')
    site_profile(tmp_path / "site", "ours", port=8123)
    assert node_profile(validated(str(inventory)).head).port == 8123
    assert "ours" in profile_names(str(tmp_path / "site")) and "ours" not in profile_names()
    (tmp_path / "site" / "profiles" / "ours.yaml").unlink()
    assert main(["config", str(inventory)]) == FAILED
    assert f"the site's {tmp_path / 'site' / 'profiles'}" in capsys.readouterr().err


def test_a_sites_profile_on_a_shipped_base_changes_only_the_fields_it_gives(tmp_path):
    inventory = example_site(tmp_path / "site", choice='drafter_license_acknowledged = "CC-BY-NC-ND-4.0"\n'
                                                       'serving_profile = "ours"\n')
    (tmp_path / "site" / "profiles").mkdir(exist_ok=True)
    (tmp_path / "site" / "profiles" / "ours.yaml").write_text(f"base: {SHIPPED}\ngpu_memory_utilization: 0.5\n")
    shipped, ours = load_profile(SHIPPED).model_dump(), node_profile(validated(str(inventory)).head).model_dump()
    assert {k for k in shipped if shipped[k] != ours[k]} == {"name", "gpu_memory_utilization"}
    assert (ours["name"], ours["gpu_memory_utilization"]) == ("ours", 0.5)


def refusal_of_site_profile(site: Path, text: str) -> str:
    """load_profile's refusal of the site's profiles/ours.yaml holding `text`."""
    (site / "profiles").mkdir()
    (site / "profiles" / "ours.yaml").write_text(text)
    with pytest.raises(ValueError) as err:
        load_profile("ours", site_dir=str(site))
    return str(err.value)


@pytest.mark.parametrize("base", ["no-such-profile", "ours", 3])
def test_a_base_that_is_not_a_shipped_profile_is_refused_naming_the_file_line_and_the_shipped_ones(tmp_path, base):
    refusal = refusal_of_site_profile(tmp_path, f"# a site's profile\nbase: {base}\nport: 8123\n")
    assert f"{tmp_path / 'profiles' / 'ours.yaml'} line 2): base = {base!r}: name a shipped profile" in refusal
    assert ", ".join(profile_names()) in refusal


def test_a_refused_field_of_a_based_profile_names_both_files(tmp_path):
    refusal = refusal_of_site_profile(tmp_path, f"base: {SHIPPED}\ngpu_memory_utilization: 2\n")
    assert (f"({tmp_path / 'profiles' / 'ours.yaml'}, on {PROFILES_DIR / SHIPPED}.yaml): line 2: "
            f"gpu_memory_utilization = 2") in refusal


def test_the_lab_serves_the_shipped_profile_with_only_its_memory_share_changed():
    shipped, lab = load_profile(SHIPPED).model_dump(), load_profile(SHIPPED, site_dir=str(REPO / "lab")).model_dump()
    assert {k for k in shipped if shipped[k] != lab[k]} == {"gpu_memory_utilization"}


def test_another_sites_profiles_are_not_this_ones(tmp_path):
    """serving_site is the inventory's own directory: two sites side by side each serve their own."""
    first, second = example_site(tmp_path / "one"), example_site(tmp_path / "two")
    site_profile(tmp_path / "one", SHIPPED, port=8124)
    assert node_profile(validated(str(first)).head).port == 8124
    assert node_profile(validated(str(second)).head).port != 8124


# ---------------------------------------------------- the raw pyinfra form, run from the checkout

def test_pyinfra_from_the_checkout_reads_the_sites_group_data(tmp_path, listener):
    ports, accepted = listener
    inventory = write_inventory(tmp_path, ports, site_data='drafter_license_acknowledged = "CC-BY-NC-ND-4.0"\n'
                                                           "fabric_mtu = 90000\n")
    code, out = run_pyinfra(inventory)
    assert code != 0 and accepted == []
    assert "key 'fabric_mtu' = 90000" in out and f"from: {tmp_path / 'group_data' / 'all.py'} line 2" in out


def test_pyinfra_from_the_checkout_refuses_a_site_without_the_choice(tmp_path, listener):
    ports, accepted = listener
    code, out = run_pyinfra(write_inventory(tmp_path, ports, site_data=None))
    assert code != 0 and accepted == []
    assert "spark-a: key 'drafter_license_acknowledged' = None" in out and "no derivatives" in out


def test_pyinfra_from_the_checkout_serves_the_sites_profile(tmp_path, listener):
    """The site's profile replaces the shipped one in the run: its port, made the engine's, is refused."""
    ports, accepted = listener
    inventory = write_inventory(tmp_path, ports)
    site_profile(tmp_path, SHIPPED, port=18000)  # api_proxy_engine_port's default
    code, out = run_pyinfra(inventory)
    assert code != 0 and accepted == []
    assert f"port 18000 is both profile {SHIPPED}'s port and api_proxy_engine_port" in out


def test_a_valid_site_reaches_its_hosts(tmp_path, listener):
    ports, accepted = listener
    site_profile(tmp_path, SHIPPED, port=8125)
    code, _ = run_pyinfra(write_inventory(tmp_path, ports))
    assert code != 0 and len(accepted) >= 1  # validated, then connected (the listeners are no SSH servers)


# ----------------------------------------------------------------------------- the tracked example

def test_the_example_is_tracked_and_a_site_in_the_checkout_is_not(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "site.example"], cwd=REPO, capture_output=True, text=True).stdout
    assert {"site.example/inventory.py", "site.example/group_data/all.py"} <= set(tracked.split())
    paths = ["site/inventory.py", "site/group_data/all.py", "site/profiles/x.yaml"]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
    assert ignored.stdout.split() == paths
    # The root inventory.py is tracked and sparkfleet's: the site's front, with no host of its own to edit.
    assert "inventory.py" in subprocess.run(["git", "ls-files", "inventory.py"], cwd=REPO, capture_output=True,
                                            text=True).stdout.split()
    assert "sparks(" not in (REPO / "inventory.py").read_text()


@pytest.mark.parametrize("target, command", [
    ("doctor", "pyinfra -y {inv} doctor.py"), ("status", "pyinfra -y {inv} status.py"),
    ("rollback", "pyinfra -y {inv} rollback.py"), ("plan", "sparkfleet plan {inv}"),
    ("config", "sparkfleet config {inv}"), ("capture", "sparkfleet capture {inv}"),
    ("deploy", "sparkfleet deploy {inv}"),
])
def test_every_make_target_takes_a_site_inventory_outside_the_checkout(target, command, tmp_path):
    inventory = tmp_path / "site" / "inventory.py"
    result = subprocess.run(["make", "-n", target, f"INVENTORY={inventory}"], cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert command.format(inv=inventory) in result.stdout


def test_the_example_group_data_sets_no_key_the_shipped_defaults_do_not_know():
    """Every line of the example's group_data that a user uncomments is a known key, valid with the rest."""
    text = (SITE_EXAMPLE / "group_data" / "all.py").read_text()
    keys = [line[2:].split(" = ")[0] for line in text.splitlines() if line.startswith("# ") and " = " in line]
    assert keys == ["drafter_license_acknowledged", "deployment_purpose", "serving_profile"]


# ------------------------------------------- the checkout's inventory.py: the front of the site

def front_and_site(tmp_path) -> tuple[Path, Path]:
    """A site that sets keys at every level pyinfra merges: its group_data/all.py (over the shipped
    defaults), a group file of its inventory's group spark_hosts (over its all.py), a host's own data
    (over both); returns the checkout's front inventory.py and the site's inventory.py."""
    site = tmp_path / "site"
    inventory = example_site(site, choice='drafter_license_acknowledged = "CC-BY-NC-ND-4.0"\n'
                                          "serving_health_timeout_s = 900\nfabric_mtu = 9000\n"
                                          "preflight_min_free_disk_gib = 300.0\n")
    (site / "group_data" / "spark_hosts.py").write_text("serving_health_timeout_s = 950\n")
    text = inventory.read_text()
    assert text.count('"ssh_user": "root", "rank": 1,') == 1
    inventory.write_text(text.replace('"ssh_user": "root", "rank": 1,',
                                      '"ssh_user": "root", "rank": 1, "preflight_min_free_disk_gib": 400.0,'))
    return REPO / "inventory.py", inventory


def host_data(inventory_file: Path) -> dict:
    """Every host's merged data and groups as pyinfra builds them from the checkout (the CLI's cwd)."""
    inventory = load_inventory(inventory_file, cwd=str(REPO))
    return {host.name: (host.data.dict(), sorted(host.groups)) for host in inventory}


def test_the_front_gives_every_host_the_data_the_site_inventory_does(tmp_path, monkeypatch):
    front, inventory = front_and_site(tmp_path)
    monkeypatch.setenv(SITE_VARIABLE, str(tmp_path / "site"))
    through_front, direct = host_data(front), host_data(inventory)
    assert through_front == direct
    a, b = direct["spark-a"][0], direct["spark-b"][0]
    assert a["serving_health_timeout_s"] == b["serving_health_timeout_s"] == 950  # the group file over all.py
    assert (a["preflight_min_free_disk_gib"], b["preflight_min_free_disk_gib"]) == (300.0, 400.0)  # host over all
    assert a["drafter_license_acknowledged"] == "CC-BY-NC-ND-4.0" and a["fabric_netdev"] == "enp1s0f0np0"
    assert a["serving_site"] == b["serving_site"] == str(tmp_path / "site")


def test_sparkfleet_config_of_the_front_prints_the_sites_values(tmp_path):
    front_and_site(tmp_path)
    result = subprocess.run([sys.executable, "-m", "sparkfleet", "config", "inventory.py", "--host", "spark-b"],
                            cwd=REPO, capture_output=True, text=True, env={**os.environ,
                                                                          SITE_VARIABLE: str(tmp_path / "site")})
    assert result.returncode == OK, result.stderr
    out = yaml.safe_load(result.stdout)["spark-b"]
    assert (out["serving_health_timeout_s"], out["preflight_min_free_disk_gib"]) == (950, 400.0)
    assert out["serving_site"] == str(tmp_path / "site")


def test_the_front_without_a_site_names_the_places_looked_at_and_how_to_make_one(tmp_path, monkeypatch, capsys):
    checkout = tmp_path / "checkout"  # the front looks for site/ beside itself: a checkout without one
    checkout.mkdir()
    shutil.copy(REPO / "inventory.py", checkout / "inventory.py")
    monkeypatch.delenv(SITE_VARIABLE, raising=False)
    assert main(["config", str(checkout / "inventory.py")]) == FAILED
    err = capsys.readouterr().err
    assert f"no site inventory: looked at {SITE_VARIABLE} (not set), then {checkout / 'site' / 'inventory.py'}" in err
    assert "cp -r site.example site" in err and "Traceback" not in err
    monkeypatch.setenv(SITE_VARIABLE, str(tmp_path / "nowhere"))
    assert main(["config", "inventory.py"]) == FAILED
    assert f"looked at {SITE_VARIABLE}={tmp_path / 'nowhere'} ({tmp_path / 'nowhere' / 'inventory.py'})" in \
        capsys.readouterr().err


def test_pyinfra_with_the_front_reads_the_sites_group_data(tmp_path, listener):
    ports, accepted = listener
    write_inventory(tmp_path, ports, site_data='drafter_license_acknowledged = "CC-BY-NC-ND-4.0"\n'
                                               "fabric_mtu = 90000\n")
    code, out = run_pyinfra("inventory.py", env={SITE_VARIABLE: str(tmp_path)})
    assert code != 0 and accepted == []
    # traced to the site's file, though the front hands it to pyinfra as host data
    assert "key 'fabric_mtu' = 90000" in out and f"from: {tmp_path / 'group_data' / 'all.py'} line 2" in out


def test_pyinfra_with_the_front_and_no_site_is_refused_before_any_connection(tmp_path, listener):
    ports, accepted = listener
    code, out = run_pyinfra("inventory.py", env={SITE_VARIABLE: str(tmp_path / "nowhere")})
    assert code != 0 and accepted == []
    assert "no site inventory" in out and "cp -r site.example site" in out and "Traceback" not in out


def test_pyinfra_with_the_front_reaches_a_valid_sites_hosts(tmp_path, listener):
    ports, accepted = listener
    write_inventory(tmp_path, ports)
    code, _ = run_pyinfra("inventory.py", env={SITE_VARIABLE: str(tmp_path)})
    assert code != 0 and len(accepted) >= 1  # validated, then connected (the listeners are no SSH servers)
