"""roles/firewall: the rules of one node, rendered from data and the cluster, and the facts they need.

One nftables table, `inet sparkfleet`, with one input chain at policy accept: it drops only what it
names and accepts nothing another table would drop (an accept in one table does not bind another).
  - the node's fabric address answers on the fabric netdev only (Linux answers any local address on
    any interface: a machine routing the fabric address via the management address reached it);
  - on the fabric netdev, only the other nodes' fabric addresses (IPv4);
  - the rendezvous port (torch's TCPStore listens on every address), the registry and the rsync
    daemon are reached over the fabric netdev only; collectives (NCCL, Gloo, vLLM's own sockets) bind
    the fabric address and are covered by the first rule;
  - on the head, the API port from the allowed networks only; on the router node (roles/router), the
    router's port likewise;
  - on the head, the engine's own port (loopback only, behind the API proxy) from root's and the
    proxy's sockets only (an output chain: a local user cannot go around the proxy);
  - the exporters (roles/monitoring: the node exporter, the engine's /metrics on a head) from the
    monitoring node's address only.
SSH is never matched. Loopback is always accepted.
"""
import shlex
from ipaddress import IPv4Network, ip_address, ip_interface

from pyinfra.api import FactBase

from roles.api_proxy.checks import PROXY_USER
from sparkfleet.model.monitoring import monitoring_node_name
from sparkfleet.model.serving import node_profile
from sparkfleet.render import render, sha1_text

TABLE = "inet sparkfleet"
UNIT = "sparkfleet-firewall"
UNIT_PATH = f"/etc/systemd/system/{UNIT}.service"
# The distribution's nftables.service flushes the ruleset on restart and reload: this drop-in loads
# sparkfleet's table again after it.
NFTABLES_DROPIN = "/etc/systemd/system/nftables.service.d/50-sparkfleet.conf"
NFT = "/usr/sbin/nft"
# Who may connect to the head's engine port on loopback: root (the deploy's probes, the watchdog, the
# engine's own processes) and the API proxy's workers. Anyone else on the head would reach routes the
# engine answers without the key (sparkfleet/model/api_proxy.py); they go through the proxy like the LAN.
ENGINE_PORT_USERS = ("root", PROXY_USER)


def rules_path(node) -> str:
    return f"{node.serving_dir}/firewall.nft"


def fabric_ports(cluster, node) -> list[int]:
    profile = node_profile(cluster.head)
    # fabric_speed_port: iperf3's server and the speed proof's rendezvous (roles/fabric_speed).
    return sorted({profile.master_port, node.docker_registry_port, node.fanout_rsync_port, node.fabric_speed_port})


def api_networks(node, management_subnet: str | None) -> list[str]:
    """The networks allowed to the API: data's, else the node's management subnet."""
    if node.firewall_api_allowed_networks is not None:
        return [str(n) for n in node.firewall_api_allowed_networks]
    return [management_subnet] if management_subnet else []


def api_ports(node, profile) -> list[int]:
    """The ports reached from the allowed API networks on this node: the head's API, the router's
    (roles/router) on router_node."""
    return ([profile.port] if node.is_head else []) + ([node.router_port] if node.router_node == node.name else [])


def monitor_ports(node) -> list[int]:
    """The exporters' ports on this node (roles/monitoring), reached from the monitoring node only."""
    if not node.monitoring_enabled:
        return []
    return ([node.monitoring_node_exporter_port] + ([node.monitoring_engine_metrics_port] if node.is_head else [])
            + ([node.monitoring_gpu_exporter_port] if node.gpu_expected else []))


def _body(cluster, node, management_subnet: str | None, marker: str, monitor: str | None = None) -> str:
    profile = node_profile(cluster.head)
    # Each half of the port admits the peers' addresses on that half only.
    halves = [{"netdev": half.netdev, "ip": half.ip, "quoted": f'"{half.netdev}"',
               "peers": [peer.fabric_halves[i].ip for peer in cluster.peers(node)]}
              for i, half in enumerate(node.fabric_halves)]
    return render(
        "firewall", "/etc/sparkfleet/firewall.nft", marker=marker, halves=halves,
        fabric_ports=fabric_ports(cluster, node), api_ports=api_ports(node, profile),
        api_allowed=api_networks(node, management_subnet),
        engine_port=node.api_proxy_engine_port if node.is_head else None, engine_users=ENGINE_PORT_USERS,
        monitor_ports=monitor_ports(node) if monitor else [], monitor=monitor,
    )


def rules_text(cluster, node, management_subnet: str | None, monitor: str | None = None) -> str:
    """The node's ruleset file. Its first rule carries `sparkfleet <sha1 of the rules>` as a comment,
    so the live table is compared with what data renders (a hand-flushed table is re-applied).
    `monitor`: the monitoring node's IPv4 address as this node resolves it (None: no monitoring)."""
    return _body(cluster, node, management_subnet, f"sparkfleet {digest(cluster, node, management_subnet, monitor)}",
                 monitor)


def digest(cluster, node, management_subnet: str | None, monitor: str | None = None) -> str:
    return sha1_text(_body(cluster, node, management_subnet, "sparkfleet", monitor))


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


class ManagementSubnet(FactBase):
    """The connected IPv4 subnet (`198.18.0.11/24`) of the address this SSH session arrived at (sudo
    keeps SSH_CONNECTION out: then the management address from the inventory), or ''."""

    def command(self, address: str) -> str:
        return (
            f"set -- ${{SSH_CONNECTION:-}}; a=${{3:-{shlex.quote(address)}}}; "
            "ip -o -4 addr show | awk -v a=\"$a\" '{split($4, p, \"/\"); if (p[1] == a) {print $4; exit}}'"
        )

    def process(self, output):
        text = "".join(output).strip()
        if not text:
            return ""
        return str(ip_interface(text).network)


class Ipv4Of(FactBase):
    """The first IPv4 address `hostname` resolves to on the node (getent ahostsv4), or ''."""

    def command(self, hostname: str) -> str:
        return f"getent ahostsv4 {shlex.quote(hostname)} | awk 'NR == 1 {{print $1}}' || true"

    def process(self, output):
        return "".join(output).strip()


def monitor_address(node_host, fleet) -> str | None:
    """The monitoring node's IPv4 address as `node_host` resolves its management address (an address
    is itself), '' when it does not resolve; None when monitoring is off."""
    name = monitoring_node_name(list(fleet.nodes))
    if name is None:
        return None
    address = fleet.node(name).management_address
    return address if is_ipv4(address) else node_host.get_fact(Ipv4Of, hostname=address)


def is_ipv4(text: str) -> bool:
    try:
        return ip_address(text).version == 4
    except ValueError:
        return False


def wanted_marker(fleet, cluster, node, node_host, subnet: str | None) -> str:
    """`sparkfleet <digest>`: the marker of the table data renders for this node (LiveMarker's value
    when the live table is that one)."""
    return wanted_marker_of(cluster, node, subnet, monitor_address(node_host, fleet))


def wanted_marker_of(cluster, node, subnet: str | None, monitor: str | None) -> str:
    """wanted_marker from its facts: the management subnet and the monitoring node's address as the
    node resolves it (monitor_address)."""
    return f"sparkfleet {digest(cluster, node, subnet, monitor)}"


def monitor_problem(node, fleet, monitor: str | None) -> str | None:
    if monitor == "":
        name = monitoring_node_name(list(fleet.nodes))
        return (f"{node.name}: the monitoring node {name}'s management address "
                f"{fleet.node(name).management_address!r} does not resolve to an IPv4 address on {node.name}: the "
                "exporters' rule admits that address only (key 'monitoring_node'; set its ssh_hostname to its "
                "address, or monitoring_enabled = False)")
    return None


class LiveMarker(FactBase):
    """`sparkfleet <sha1>` from the live table's first rule; '' when there is no table (or no nft)."""

    def command(self) -> str:
        return (f"command -v nft >/dev/null && nft list table {TABLE} 2>/dev/null "
                "| grep -o 'sparkfleet [0-9a-f]\\{40\\}' | head -n 1 || true")

    def process(self, output):
        return "".join(output).strip()


def management_problem(node, subnet: str) -> str | None:
    if node.firewall_api_allowed_networks is None and not subnet:
        return (f"{node.name}: the management subnet could not be read (no local address matches the SSH "
                f"session's); set firewall_api_allowed_networks (e.g. [\"192.168.1.0/24\"]) in data. Nothing was "
                f"changed.")
    return None


__all__ = ["IPv4Network"]
