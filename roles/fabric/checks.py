"""Is the fabric as the data says, on every node? And is it proven to carry jumbo frames?

pyinfra reads facts at prepare time, before any operation. So the verdict is taken there, for
all nodes at once: when every node already has its netplan file and its live link as declared,
the jumbo-frame proof runs as a read-only fact (a converged deploy changes nothing); otherwise
the proof runs as an operation after `netplan apply` has run on every node.
"""
from dataclasses import dataclass, field
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File

from roles.fabric.facts import FabricLink, FabricPing, ping_command
from roles.fabric.others import FabricConfigs, OtherConfig, other_configs
from roles.fabric.schema import NETPLAN_FILE
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import active_hosts, once_per_run, per_host
from sparkfleet.render import render, sha1_text


def netplan_text(node) -> str:
    return render("fabric", NETPLAN_FILE, node=node)


def link_drift(node, link: dict | None) -> list[str]:
    """How the live link differs from the data (empty when it matches)."""
    if link is None:
        return [f"{node.fabric_netdev} missing"]
    drift = []
    if link["mtu"] != node.fabric_mtu:
        drift.append(f"mtu {link['mtu']} (want {node.fabric_mtu})")
    if not link["up"]:
        drift.append("link down")
    if link["ipv4"] != [str(node.fabric_address)]:  # missing, or another beside it (a second configuration)
        drift.append(f"address {', '.join(link['ipv4']) or 'none'} (want {node.fabric_address})")
    return drift


def link_failure(node, node_mtu, peer, peer_mtu) -> str:
    return (
        f"fabric: {node.name} ({node.fabric_netdev} mtu {node_mtu}) cannot reach {peer.name} at "
        f"{peer.fabric_ip} ({peer.fabric_netdev} mtu {peer_mtu}) with unfragmented "
        f"{node.ping_payload}-byte pings (ping -M do -s {node.ping_payload}); both ends need mtu {node.fabric_mtu}"
    )


def _fabric_others(state) -> dict[str, tuple[dict, list[OtherConfig]]]:
    cluster = cluster_from_state(state)

    def one(node_host):
        node = cluster.node(node_host.name)
        facts = node_host.get_fact(FabricConfigs, netdev=node.fabric_netdev)
        return facts, other_configs(facts, node.fabric_netdev)

    return per_host(state, one)


def fabric_others(state) -> dict[str, tuple[dict, list[OtherConfig]]]:
    """node name -> (raw facts, every other configuration of its fabric netdev), read at prepare."""
    return once_per_run(state, "fabric-others", lambda: _fabric_others(state))


@dataclass
class FabricState:
    converged: bool
    drift: dict[str, list[str]] = field(default_factory=dict)  # node name -> differences
    file_current: dict[str, bool] = field(default_factory=dict)


def node_status(node_host, node) -> tuple[dict | None, list[str], bool]:
    """(live link, its drift from the data, whether the netplan file is as rendered), from facts."""
    link = node_host.get_fact(FabricLink, netdev=node.fabric_netdev)
    file_current = node_host.get_fact(Sha1File, path=NETPLAN_FILE) == sha1_text(netplan_text(node))
    return link, link_drift(node, link), file_current


def _fabric_state(state) -> FabricState:
    cluster = cluster_from_state(state)
    hosts = {h.name: h for h in active_hosts(state)}
    result = FabricState(converged=True)
    links = {}
    statuses = per_host(state, lambda h: node_status(h, cluster.node(h.name)), hosts.values())
    for name in hosts:
        links[name], result.drift[name], result.file_current[name] = statuses[name]
        if result.drift[name] or not result.file_current[name] or fabric_others(state)[name][1]:
            result.converged = False
    if result.converged:
        # Nothing will change: prove the link now, read-only, before any operation runs.
        def pings(node_host):
            node = cluster.node(node_host.name)
            return [(peer, node_host.get_fact(FabricPing, peer_ip=peer.fabric_ip, payload=node.ping_payload))
                    for peer in cluster.peers(node)]

        failures = []
        for name, answers in per_host(state, pings, hosts.values()).items():
            for peer, ok in answers:
                if not ok:
                    peer_mtu = links[peer.name]["mtu"] if links.get(peer.name) else "unknown"
                    failures.append(link_failure(cluster.node(name), links[name]["mtu"], peer, peer_mtu))
        if failures and not _firewall_moves(state, cluster, hosts):
            raise DeployError("\n".join(failures))
        # A firewall about to change (a node joined the group, an address moved) may be what stops the
        # pings: the proof runs after roles/firewall applied it (roles/fabric/proof_tasks.py).
        result.converged = not failures
    return result


def _firewall_moves(state, cluster, hosts) -> bool:
    """Whether roles/firewall will change the live rules on any node of the group in this run."""
    from roles.firewall.checks import LiveMarker, ManagementSubnet, digest

    def moves(node_host):
        node = cluster.node(node_host.name)
        if not node.firewall_enabled:
            return False
        subnet = node_host.get_fact(ManagementSubnet, address=node.management_address)
        return node_host.get_fact(LiveMarker) != f"sparkfleet {digest(cluster, node, subnet)}"

    return any(per_host(state, moves, hosts.values()).values())


def fabric_state(state) -> FabricState:
    return once_per_run(state, "fabric", lambda: _fabric_state(state))


def _live_mtu(node_host, netdev: str):
    ok, output = node_host.run_shell_command(StringCommand(f"cat /sys/class/net/{netdev}/mtu"))
    return output.stdout.strip() if ok else "unknown"


def prove_jumbo_frames(node, peers) -> None:
    """Operation body: ping every peer unfragmented at full MTU, naming both ends on failure."""
    from pyinfra import host, state  # the executing host, set by pyinfra while the operation runs

    failures = []
    for peer in peers:
        ok, _ = host.run_shell_command(StringCommand(ping_command(peer.fabric_ip, node.ping_payload, settle_seconds=10)))
        if not ok:
            peer_host = state.inventory.get_host(peer.name)
            failures.append(
                link_failure(node, _live_mtu(host, node.fabric_netdev), peer, _live_mtu(peer_host, peer.fabric_netdev))
            )
    if failures:
        raise DeployError("\n".join(failures))
