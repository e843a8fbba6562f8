"""Is the fabric as the data says, on every node? And is it proven to carry jumbo frames?

pyinfra reads facts at prepare time, before any operation. So the verdict is taken there, for
all nodes at once: when every node already has its netplan file and its live link as declared,
the jumbo-frame proof runs as a read-only fact (a converged deploy changes nothing); otherwise
the proof runs as an operation after `netplan apply` has run on every node.
"""

from pyinfra import host, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File

from roles.fabric.facts import FabricLink, FabricPing, ping_command
from roles.fabric.others import FabricConfigs, OtherConfig, other_configs
from roles.firewall.checks import LiveMarker, ManagementSubnet, wanted_marker
from sparkfleet.inventory import cluster_from_state, fleet_from_state
from sparkfleet.model.fabric import NETPLAN_FILE, FabricHalf
from sparkfleet.once import active_hosts, once_per_run, per_host
from sparkfleet.render import render, sha1_text
from sparkfleet.verdicts import FabricState  # noqa: F401 (this role's verdict, on the ground floor)


def netplan_text(node) -> str:
    return render("fabric", NETPLAN_FILE, node=node)


def link_drift(node, link: dict | None, half: FabricHalf | None = None) -> list[str]:
    """How the live link of one half of the port (the first by default) differs from the data
    (empty when it matches); the twin's differences are named with its netdev."""
    half = half or node.fabric_halves[0]
    said = "" if half.netdev == node.fabric_netdev else f"{half.netdev} "
    if link is None:
        return [f"{half.netdev} missing"]
    drift = []
    if link["mtu"] != node.fabric_mtu:
        drift.append(f"{said}mtu {link['mtu']} (want {node.fabric_mtu})")
    if not link["up"]:
        drift.append(f"{said}link down")
    if link["ipv4"] != [str(half.address)]:  # missing, or another beside it (a second configuration)
        drift.append(f"{said}address {', '.join(link['ipv4']) or 'none'} (want {half.address})")
    return drift


def port_drift(node, links: dict[str, dict | None]) -> list[str]:
    """Every half's drift, from {netdev: live link}."""
    return [d for half in node.fabric_halves for d in link_drift(node, links.get(half.netdev), half)]


def link_failure(node, node_mtu, peer, peer_mtu, half: int = 0) -> str:
    """A failed jumbo-frame proof over half `half` (0: the first, 1: the twin) of the port, both
    ends named. A twin that does not answer costs half the cable's bandwidth: said so."""
    mine, theirs = node.fabric_halves[half], peer.fabric_halves[half]
    cost = ("; NCCL would run over the first half alone: about half of what the cable carries (is the twin "
            "cabled and up on both ends?)" if half else "")
    return (
        f"fabric: {node.name} ({mine.netdev} mtu {node_mtu}) cannot reach {peer.name} at "
        f"{theirs.ip} ({theirs.netdev} mtu {peer_mtu}) with unfragmented "
        f"{node.ping_payload}-byte pings (ping -M do -s {node.ping_payload}); both ends need mtu {node.fabric_mtu}"
        f"{cost}"
    )


def half_pairs(node, peer):
    """(index, this node's half, the peer's half) for each half both ends configure."""
    return [(i, mine, theirs) for i, (mine, theirs) in enumerate(zip(node.fabric_halves, peer.fabric_halves))]


def _fabric_others(state) -> dict[str, tuple[dict, list[OtherConfig]]]:
    cluster = cluster_from_state(state)

    def one(node_host):
        node = cluster.node(node_host.name)
        facts = node_host.get_fact(FabricConfigs, netdev=node.fabric_netdev, twin=node.fabric_twin_netdev)
        return facts, other_configs(facts, tuple(h.netdev for h in node.fabric_halves))

    return per_host(state, one)


def fabric_others(state) -> dict[str, tuple[dict, list[OtherConfig]]]:
    """node name -> (raw facts, every other configuration of its fabric netdevs), read at prepare."""
    return once_per_run(state, "fabric-others", lambda: _fabric_others(state))


def node_status(node_host, node) -> tuple[dict[str, dict | None], list[str], bool]:
    """({netdev: live link} of each half, their drift from the data, whether the netplan file is as
    rendered), from facts."""
    links = {h.netdev: node_host.get_fact(FabricLink, netdev=h.netdev) for h in node.fabric_halves}
    file_current = node_host.get_fact(Sha1File, path=NETPLAN_FILE) == sha1_text(netplan_text(node))
    return links, port_drift(node, links), file_current


def live_mtu(links: dict[str, dict | None], netdev: str):
    link = links.get(netdev) if links else None
    return link["mtu"] if link else "unknown"


def _fabric_state(state) -> FabricState:
    cluster = cluster_from_state(state)
    hosts = {h.name: h for h in active_hosts(state)}
    statuses = per_host(state, lambda h: node_status(h, cluster.node(h.name)), hosts.values())
    links = {name: statuses[name][0] for name in hosts}
    drift = {name: statuses[name][1] for name in hosts}
    file_current = {name: statuses[name][2] for name in hosts}
    converged = not any(drift[name] or not file_current[name] or fabric_others(state)[name][1] for name in hosts)
    if converged:
        # Nothing will change: prove the link now, read-only, before any operation runs.
        answers = per_host(state, lambda h: ping_failures(h, cluster.node(h.name), cluster, links), hosts.values())
        failures = [f for name in hosts for f in answers[name]]
        if failures and not _firewall_moves(state, cluster, hosts):
            raise DeployError("\n".join(failures))
        # A firewall about to change (a node joined the group, an address moved) may be what stops the
        # pings: the proof runs after roles/firewall applied it (roles/fabric/proof_tasks.py).
        converged = not failures
    return FabricState(converged=converged, drift=drift, file_current=file_current)


def ping_failures(node_host, node, cluster, links: dict[str, dict]) -> list[str]:
    """The jumbo-frame proof as read-only facts, from `node` to every peer over each half: a failure
    per half that does not answer, both ends named (links: node name -> {netdev: live link})."""
    return [link_failure(node, live_mtu(links.get(node.name), mine.netdev), peer,
                         live_mtu(links.get(peer.name), theirs.netdev), i)
            for peer in cluster.peers(node) for i, mine, theirs in half_pairs(node, peer)
            if not node_host.get_fact(FabricPing, peer_ip=theirs.ip, payload=node.ping_payload)]


def _firewall_moves(state, cluster, hosts) -> bool:
    """Whether roles/firewall will change the live rules on any node of the group in this run."""
    fleet = fleet_from_state(state)

    def moves(node_host):
        node = cluster.node(node_host.name)
        if not node.firewall_enabled:
            return False
        subnet = node_host.get_fact(ManagementSubnet, address=node.management_address)
        return node_host.get_fact(LiveMarker) != wanted_marker(fleet, cluster, node, node_host, subnet)

    return any(per_host(state, moves, hosts.values()).values())


def fabric_state(state) -> FabricState:
    """The fabric's verdict from this run's facts (tools/plan.py takes it once, for the run's plan):
    each node's drift, and, when nothing will change, the read-only proof that jumbo frames pass."""
    return _fabric_state(state)


def _live_mtu(node_host, netdev: str):
    ok, output = node_host.run_shell_command(StringCommand(f"cat /sys/class/net/{netdev}/mtu"))
    return output.stdout.strip() if ok else "unknown"


def prove_jumbo_frames(node, peers) -> None:
    """Operation body: ping every peer unfragmented at full MTU, naming both ends on failure."""

    failures = []
    for peer in peers:
        for i, mine, theirs in half_pairs(node, peer):
            ok, _ = host.run_shell_command(StringCommand(ping_command(theirs.ip, node.ping_payload, settle_seconds=10)))
            if not ok:
                peer_host = state.inventory.get_host(peer.name)
                failures.append(
                    link_failure(node, _live_mtu(host, mine.netdev), peer, _live_mtu(peer_host, theirs.netdev), i)
                )
    if failures:
        raise DeployError("\n".join(failures))
