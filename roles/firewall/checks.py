"""roles/firewall: the node's ruleset file, its unit and nftables' drop-in, and the checks around them
(the doctor's row, the monitoring node's address as the node resolves it, the refusals).

The rules themselves are rendered on the ground floor (sparkfleet/firewall_rules.py, which says what
they drop and admit), and the facts read of a node's table and addresses are there too
(sparkfleet/firewall_facts.py): roles/fabric weighs both when a ping fails.
"""
from ipaddress import IPv4Network

from sparkfleet.firewall_facts import Ipv4Of, is_ipv4
from sparkfleet.firewall_rules import wanted_marker_of
from sparkfleet.model.firewall import TABLE
from sparkfleet.model.monitoring import monitoring_node_name
from sparkfleet.render import render

UNIT = "sparkfleet-firewall"
UNIT_PATH = f"/etc/systemd/system/{UNIT}.service"
# The distribution's nftables.service flushes the ruleset on restart and reload: this drop-in loads
# sparkfleet's table again after it.
NFTABLES_DROPIN = "/etc/systemd/system/nftables.service.d/50-sparkfleet.conf"
NFT = "/usr/sbin/nft"


def rules_path(node) -> str:
    return f"{node.serving_dir}/firewall.nft"


def unit_text(node) -> str:
    return render("firewall", UNIT_PATH, path=rules_path(node))


def nftables_dropin_text(node) -> str:
    return render("firewall", NFTABLES_DROPIN, path=rules_path(node))


def table_problems(node, live: str, want: str) -> list[str]:
    """The doctor's firewall row: the live table inet sparkfleet is there and is the one data renders
    (`live`: LiveMarker, `want`: `sparkfleet <digest>`)."""
    if not node.firewall_enabled:
        return []
    if not live:
        return [f"{node.name}: the nftables table {TABLE} is missing (`nft flush ruleset`, or removed by hand): the "
                f"fabric's services and the API are unfiltered; a deploy puts it back (or systemctl restart {UNIT})"]
    if live != want:
        return [f"{node.name}: the nftables table {TABLE} is not the one data renders (live marker {live!r}, want "
                f"{want!r}): deploy"]
    return []


def monitor_address(node_host, fleet) -> str | None:
    """The monitoring node's IPv4 address as `node_host` resolves its management address (an address
    is itself), '' when it does not resolve; None when monitoring is off."""
    name = monitoring_node_name(list(fleet.nodes))
    if name is None:
        return None
    address = fleet.node(name).management_address
    return address if is_ipv4(address) else node_host.get_fact(Ipv4Of, hostname=address)


def wanted_marker(fleet, cluster, node, node_host, subnet: str | None) -> str:
    """`sparkfleet <digest>`: the marker of the table data renders for this node (LiveMarker's value
    when the live table is that one)."""
    return wanted_marker_of(cluster, node, subnet, monitor_address(node_host, fleet))


def monitor_problem(node, fleet, monitor: str | None) -> str | None:
    if monitor == "":
        name = monitoring_node_name(list(fleet.nodes))
        return (f"{node.name}: the monitoring node {name}'s management address "
                f"{fleet.node(name).management_address!r} does not resolve to an IPv4 address on {node.name}: the "
                "exporters' rule admits that address only (key 'monitoring_node'; set its ssh_hostname to its "
                "address, or monitoring_enabled = False)")
    return None


def management_problem(node, subnet: str) -> str | None:
    if node.firewall_api_allowed_networks is None and not subnet:
        return (f"{node.name}: the management subnet could not be read (no local address matches the SSH "
                f"session's); set firewall_api_allowed_networks (e.g. [\"192.168.1.0/24\"]) in data. Nothing was "
                f"changed.")
    return None


__all__ = ["IPv4Network"]
