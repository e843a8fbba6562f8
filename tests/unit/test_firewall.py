"""roles/firewall: the nftables table rendered from data (one table, SSH never matched), and its
validation before any connection."""
import shutil
import subprocess

import pytest

from roles.firewall.checks import management_problem
from sparkfleet.firewall_facts import ManagementSubnet
from sparkfleet.firewall_rules import api_networks, digest, rules_text
from sparkfleet.config import ConfigError, build_cluster
from tests.unit.helpers import pair

MGMT = "10.0.0.0/24"


def both(**data):
    return build_cluster(pair(**{n: data for n in ("spark-a", "spark-b")}))


def rules(text: str) -> list[str]:
    return [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]


def test_the_head_opens_the_api_to_the_management_subnet_and_the_fabric_services_to_the_peer_only():
    c = both()
    text = rules(rules_text(c, c.head, MGMT))
    assert text[:3] == ["table inet sparkfleet", "delete table inet sparkfleet", "table inet sparkfleet {"]
    assert 'ip daddr 10.77.77.1 iifname != "enp1s0f0np0" drop' in text
    assert 'iifname "enp1s0f0np0" ip saddr != { 10.77.77.2 } drop' in text
    # Both halves of the port are the fabric, each admitting the peer's address on that half only.
    assert 'ip daddr 10.77.78.1 iifname != "enP2p1s0f0np0" drop' in text
    assert 'iifname "enP2p1s0f0np0" ip saddr != { 10.77.78.2 } drop' in text
    assert 'iifname "enP2p1s0f0np0" meta nfproto ipv6 drop' in text
    assert 'tcp dport { 873, 5000, 29501, 29510 } iifname != { "enp1s0f0np0", "enP2p1s0f0np0" } drop' in text
    assert text.index("tcp dport 8000 ip saddr { 10.0.0.0/24 } accept") < text.index("tcp dport 8000 drop")
    assert "policy accept;" in text[4]  # drops only what it names
    worker = rules(rules_text(c, c.workers[0], MGMT))
    assert not any("8000" in l for l in worker) and 'ip daddr 10.77.77.2 iifname != "enp1s0f0np0" drop' in worker


def test_ssh_is_never_matched_and_no_other_table_is_named():
    c = both(fanout_rsync_port=8873, docker_registry_port=5001)
    for node in c.nodes:
        text = rules_text(c, node, MGMT)
        assert " 22" not in text.replace("29501", "") and "ssh" not in text.lower().replace("ssh is never", "")
        tables = {l.split("{")[0].strip() for l in text.splitlines() if l.lstrip().startswith(("table ", "delete table"))}
        assert tables == {"table inet sparkfleet", "delete table inet sparkfleet"}
        assert "flush ruleset" not in text


def test_the_allowed_networks_come_from_data_else_the_management_subnet():
    c = both(firewall_api_allowed_networks=["192.168.10.0/24", "10.1.2.3/32"])
    assert api_networks(c.head, MGMT) == ["192.168.10.0/24", "10.1.2.3/32"]
    assert "tcp dport 8000 ip saddr { 192.168.10.0/24, 10.1.2.3/32 } accept" in rules_text(c, c.head, MGMT)
    c = both()
    assert api_networks(c.head, MGMT) == [MGMT]
    assert "set firewall_api_allowed_networks" in management_problem(c.head, "")
    assert management_problem(both(firewall_api_allowed_networks=[]).head, "") is None


def test_a_bad_network_is_refused_before_connecting():
    with pytest.raises(ConfigError) as err:
        both(firewall_api_allowed_networks=["10.0.0.1/24"])
    assert "firewall_api_allowed_networks" in str(err.value) and "Input is not a valid IPv4 network" in str(err.value)


def test_the_marker_changes_only_when_the_rules_do():
    c = both()
    assert digest(c, c.head, MGMT) == digest(c, c.head, MGMT)
    assert digest(c, c.head, MGMT) != digest(c, c.head, "10.9.0.0/16")
    assert f'comment "sparkfleet {digest(c, c.head, MGMT)}"' in rules_text(c, c.head, MGMT)


def test_the_management_subnet_fact_reads_the_connected_prefix():
    assert ManagementSubnet().process(["198.18.0.11/24"]) == "198.18.0.0/24"
    assert ManagementSubnet().process([]) == ""
    assert "SSH_CONNECTION" in ManagementSubnet().command("10.0.0.11")


@pytest.mark.skipif(not shutil.which("nft") or not shutil.which("unshare"), reason="nft not installed here")
def test_nft_accepts_the_rendered_tables_and_applies_them_twice(tmp_path):
    c = both()
    for node in c.nodes:
        path = tmp_path / f"{node.name}.nft"
        path.write_text(rules_text(c, node, MGMT))
        # In a network namespace of its own: the machine's ruleset is never touched.
        run = subprocess.run(["unshare", "-n", "sh", "-c", f"nft -c -f {path} && nft -f {path} && nft -f {path} && "
                              "nft list tables"], capture_output=True, text=True)
        if run.returncode != 0 and "Operation not permitted" in run.stderr:
            pytest.skip("no permission for a network namespace here")
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == ["table", "inet", "sparkfleet"]


# --- The firewall in the boot order, and after nftables.service (issue 23) -------------------------

def listening_units(c) -> dict[str, str]:
    """{unit: text} of every unit that listens, as the roles render them for the pair's head (the
    router on the head as well)."""
    from roles.api_proxy.checks import unit_text as proxy_unit
    from sparkfleet.model.image import REGISTRY_DROPIN
    from roles.router.node_config import unit_text as router_unit
    from roles.serving.checks import rendered_files, unit_path
    from sparkfleet.render import render

    head = c.head
    return {
        "sparkfleet-rsyncd": render("fanout", "/etc/systemd/system/sparkfleet-rsyncd.service", node=head, firewall_enabled=head.firewall_enabled),
        "docker-registry (drop-in)": render("image", REGISTRY_DROPIN, firewall_enabled=head.firewall_enabled),
        "sparkfleet-head": rendered_files(c, head, 3)[unit_path(head)][0],
        "sparkfleet-worker": rendered_files(c, c.workers[0], 3)[unit_path(c.workers[0])][0],
        "sparkfleet-router": router_unit(c, head),
        "sparkfleet-api-proxy": proxy_unit(head),
    }


def unit_section(text: str) -> list[str]:
    section, out = None, []
    for line in text.splitlines():
        if line.startswith("["):
            section = line
        elif section == "[Unit]" and line and not line.startswith("#"):
            out.append(line)
    return out


def test_every_unit_that_listens_starts_after_the_firewall_and_requires_it():
    units = listening_units(both(router_node="spark-a"))
    for name, text in units.items():
        lines = unit_section(text)
        assert "After=sparkfleet-firewall.service" in lines, f"{name}: {lines}"
        assert "Requires=sparkfleet-firewall.service" in lines, f"{name}: {lines}"
    # firewall_enabled false: there is no firewall unit to require.
    for name, text in listening_units(both(router_node="spark-a", firewall_enabled=False)).items():
        assert "sparkfleet-firewall" not in text, name


def test_a_restart_or_reload_of_nftables_loads_the_table_again_and_restarts_nothing():
    from roles.firewall.checks import nftables_dropin_text, rules_path, unit_text

    head = both().head
    dropin = nftables_dropin_text(head)
    service = [l for l in dropin.splitlines() if l and not l.startswith("#")]
    assert service == ["[Service]", f"ExecStartPost=/usr/sbin/nft -f {rules_path(head)}",
                       f"ExecReload=/usr/sbin/nft -f {rules_path(head)}"]
    # Not PartOf nftables.service: its restart would restart every unit that requires the firewall.
    assert "PartOf" not in "".join(unit_section(unit_text(head)))


@pytest.mark.parametrize("live, want, found", [
    ("", "sparkfleet " + "a" * 40, "the nftables table inet sparkfleet is missing"),
    ("sparkfleet " + "b" * 40, "sparkfleet " + "a" * 40, "is not the one data renders"),
    ("sparkfleet " + "a" * 40, "sparkfleet " + "a" * 40, None),
])
def test_the_doctor_row_names_a_missing_or_stale_table(live, want, found):
    from roles.firewall.checks import table_problems

    node = both().head
    problems = table_problems(node, live, want)
    assert (problems == []) if found is None else (found in problems[0] and problems[0].startswith("spark-a: "))
    assert table_problems(both(firewall_enabled=False).head, "", want) == []


def test_a_port_of_one_half_filters_that_netdev_alone():
    from tests.unit.helpers import ONE_HALF, pair
    from sparkfleet.config import build_cluster

    c = build_cluster(pair(**{"spark-a": ONE_HALF, "spark-b": ONE_HALF}))
    text = rules(rules_text(c, c.head, MGMT))
    assert 'tcp dport { 873, 5000, 29501, 29510 } iifname != "enp1s0f0np0" drop' in text
    assert not any("enP2p1s0f0np0" in line for line in text)
