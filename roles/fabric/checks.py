"""Is the fabric as the data says, on every node? And is it proven to carry jumbo frames?

pyinfra reads facts at prepare time, before any operation. So the verdict is taken there, for
all nodes at once: when every node already has its netplan file and its live link as declared,
the jumbo-frame proof runs as a read-only fact (a converged deploy changes nothing); otherwise
the proof runs as an operation after `netplan apply` has run on every node.
"""

from dataclasses import dataclass

from pyinfra import host, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.files import Sha1File

from roles.fabric.facts import FabricLink, FabricPing, ping_command
from sparkfleet.fabric_others import OtherConfig, fabric_others
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.fabric import NETPLAN_FILE, FabricHalf
from sparkfleet.once import per_host
from sparkfleet.render import render, sha1_text
from sparkfleet.verdicts import FabricState, FirewallPlan


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


def node_status(node_host, node) -> tuple[dict[str, dict | None], list[str], bool]:
    """({netdev: live link} of each half, their drift from the data, whether the netplan file is as
    rendered), from facts."""
    links = {h.netdev: node_host.get_fact(FabricLink, netdev=h.netdev) for h in node.fabric_halves}
    file_current = node_host.get_fact(Sha1File, path=NETPLAN_FILE) == sha1_text(netplan_text(node))
    return links, port_drift(node, links), file_current


def live_mtu(links: dict[str, dict | None], netdev: str):
    link = links.get(netdev) if links else None
    return link["mtu"] if link else "unknown"


@dataclass(frozen=True)
class FabricFacts:
    """What the fabric's verdict reads, per node name, in one pass: each half's live link ({netdev:
    link}), the netplan file's sha1, the other configurations of its netdevs, whether each peer
    answers jumbo frames over each half ({(peer, half): answered}: read-only pings, which the verdict
    weighs only when nothing else changes)."""

    links: dict[str, dict[str, dict | None]]
    netplan_sha1: dict[str, str | None]
    others: dict[str, list[OtherConfig]]
    pings: dict[str, dict[tuple[str, int], bool]]


def settled(facts: FabricFacts, cluster) -> bool:
    """Whether no node's fabric changes in this run: every half's live link and every netplan file as
    data says, and no other configuration of the netdevs (pure)."""
    return not any(port_drift(node, facts.links[name]) or facts.netplan_sha1[name] != sha1_text(netplan_text(node))
                   or facts.others[name] for name, node in ((n, cluster.node(n)) for n in facts.links))


def _ping_failures(facts: FabricFacts, cluster) -> list[str]:
    return [link_failure(node, live_mtu(facts.links[name], mine.netdev), peer,
                         live_mtu(facts.links.get(peer.name), theirs.netdev), i)
            for name, node in ((n, cluster.node(n)) for n in facts.pings)
            for peer in cluster.peers(node) for i, mine, theirs in half_pairs(node, peer)
            if not facts.pings[name].get((peer.name, i), False)]


def fabric_facts(state) -> FabricFacts:
    """At prepare time, every node of the group at once: its links, netplan file and jumbo-frame pings
    to each peer over each half (read-only: a ping that cannot leave fails at once), beside the other
    configurations of its netdevs."""
    # The other configurations first, as preflight and step 3 read them (fabric_others: once per run;
    # preflight, another reader of the plan's facts pass, may have read them already). Not in each
    # node's chain of reads below: there they cost the no-op deploy a second (bench/noop.py: 5.8 s
    # against 4.8 s). Not at once with those either: the readers already hold several SSH channels per node.
    configs = fabric_others(state)
    cluster = cluster_from_state(state)

    def read(h):
        node = cluster.node(h.name)
        links = {half.netdev: h.get_fact(FabricLink, netdev=half.netdev) for half in node.fabric_halves}
        pings = {(peer.name, i): h.get_fact(FabricPing, peer_ip=theirs.ip, payload=node.ping_payload)
                 for peer in cluster.peers(node)
                 for i, (_, theirs) in enumerate(zip(node.fabric_halves, peer.fabric_halves))}  # half_pairs
        return links, h.get_fact(Sha1File, path=NETPLAN_FILE), pings

    read_by_node = per_host(state, read)
    links, sha1s, pings = ({n: r[i] for n, r in read_by_node.items()} for i in range(3))
    others = {n: configs[n][1] for n in read_by_node}
    return FabricFacts(links=links, netplan_sha1=sha1s, others=others, pings=pings)


def decide(facts: FabricFacts, cluster, firewall: dict[str, FirewallPlan] | None = None) -> FabricState:
    """The fabric's verdict, a pure function of its facts and the firewall's verdict of this run (node ->
    its plan, as step 1b took it: roles/firewall decide, handed in by the composer): each node's
    drift and whether its netplan file is current; converged when nothing changes and the read-only
    pings passed. Pings that fail stop the deploy here, naming both ends, unless a node's table is
    applied or removed in this run (then the proof runs after roles/firewall changed it:
    roles/fabric/proof_tasks.py)."""
    drift = {name: port_drift(cluster.node(name), links) for name, links in facts.links.items()}
    file_current = {name: facts.netplan_sha1[name] == sha1_text(netplan_text(cluster.node(name))) for name in facts.links}
    if not settled(facts, cluster):  # the proof runs after the link is applied again (proof_tasks.py)
        return FabricState(converged=False, drift=drift, file_current=file_current)
    failures = _ping_failures(facts, cluster)
    if failures and not any(plan.changes for plan in (firewall or {}).values()):
        raise DeployError("\n".join(failures))
    return FabricState(converged=not failures, drift=drift, file_current=file_current)


def ping_failures(node_host, node, cluster, links: dict[str, dict]) -> list[str]:
    """The doctor's jumbo-frame proof as read-only facts, from `node` to every peer over each half: a
    failure per half that does not answer, both ends named (links: node name -> {netdev: live link})."""
    return [link_failure(node, live_mtu(links.get(node.name), mine.netdev), peer,
                         live_mtu(links.get(peer.name), theirs.netdev), i)
            for peer in cluster.peers(node) for i, mine, theirs in half_pairs(node, peer)
            if not node_host.get_fact(FabricPing, peer_ip=theirs.ip, payload=node.ping_payload)]


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
