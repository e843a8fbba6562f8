"""roles/firewall on the machines: the live table is the one data renders, the fabric's services
answer over the fabric only (not through a management address that routes the fabric address), the
API only to the allowed networks, and the registry refuses deletes."""
import json
import shlex
from ipaddress import ip_address, ip_network
from pathlib import Path

import pytest

from sparkfleet.model.tls import api_base, ca_bundle_path
from sparkfleet.model.serving import node_profile
from roles.firewall.checks import NFTABLES_DROPIN, nftables_dropin_text, rules_path
from sparkfleet.firewall_facts import LiveMarker, ManagementSubnet
from sparkfleet.firewall_rules import api_networks, digest, fabric_ports, rules_text
from sparkfleet.model.monitoring import monitoring_node_name


def subnet_of(host, node) -> str:
    fact = ManagementSubnet()
    return fact.process(host.check_output(fact.command(node.management_address)).splitlines())


def monitor_of(host, cluster) -> str | None:
    """The monitoring node's management address as validation pinned it on the controller (roles/firewall
    monitor_address: no node resolves it), or None."""
    name = monitoring_node_name(list(cluster.nodes))
    return None if name is None else cluster.node(name).management_address


def test_the_live_table_is_the_one_data_renders(host, node, cluster):
    if not node.firewall_enabled:
        pytest.skip("firewall_enabled is false")
    subnet, monitor = subnet_of(host, node), monitor_of(host, cluster)
    group = cluster.group_of(node.name)
    on_disk = host.file(rules_path(node))
    assert on_disk.user == "root" and on_disk.mode == 0o600
    assert on_disk.content_string == rules_text(group, node, subnet, monitor), f"{node.name}: {rules_path(node)} differs"
    live = LiveMarker().process(host.check_output(LiveMarker().command()).splitlines())
    assert live == f"sparkfleet {digest(group, node, subnet, monitor)}", f"{node.name}: live table marker {live!r}"
    assert host.service("sparkfleet-firewall").is_enabled
    # Active (every listening unit requires it), and loaded again after nftables.service flushes.
    assert host.service("sparkfleet-firewall").is_running, f"{node.name}: sparkfleet-firewall is not active"
    dropin = host.file(NFTABLES_DROPIN)
    assert dropin.exists and dropin.content_string == nftables_dropin_text(node), f"{node.name}: {NFTABLES_DROPIN}"
    # The only table it owns; SSH never matched.
    listing = host.check_output("nft list table inet sparkfleet")
    assert "dport 22 " not in listing and f"dport {cluster.head.management_address}" not in listing


PROBE = (Path(__file__).resolve().parents[1] / "connect_probe.py").read_text()
# A dropped SYN is told from a connection only by this wait running out; a reachable port on the
# fabric or the management network connects within milliseconds (the lab under CI's load included),
# and every state run pays it once per probe of a dropped port.
CONNECT_TIMEOUT_S = 2


def tcp_open(host, address: str, ports: list[int], mark: int | None = None) -> list[int]:
    """The ports of `ports` at `address` that accept a TCP connection from `host`, as root (the output
    chain refuses the fabric to every other user, so a probe run as another user would prove nothing of
    the input rules). Every port is tried at once (tests/connect_probe.py): a dropped port costs its
    timeout once, not once per port. `mark`: every probe socket carries that firewall mark."""
    targets = json.dumps([[address, int(port)] for port in ports])
    out = host.check_output(f"python3 -c {shlex.quote(PROBE)} {CONNECT_TIMEOUT_S} {shlex.quote(targets)}"
                            + (f" {int(mark)}" if mark is not None else ""))
    return sorted(int(port) for port, got in zip(ports, json.loads(out.splitlines()[-1])) if got in ("answered", "open"))


# A routing table and rule on the peer for the probe's own sockets only (root's, carrying this firewall
# mark, SO_MARK): the pair's established fabric connections, root's as well, keep their route.
PROBE_TABLE = PROBE_MARK = 7377


def test_the_fabric_services_are_not_reached_through_a_management_address(node, cluster, node_hosts):
    """A machine that routes a node's fabric address via its management address (the office LAN
    case) reaches none of the fabric's services; over the fabric, the peers do."""
    if not node.firewall_enabled:
        pytest.skip("firewall_enabled is false")
    try:
        ip_address(node.management_address)
    except ValueError:
        pytest.skip("the management address is a name")
    peer_name = next(n.name for n in cluster.peers(node) if n.name in node_hosts)
    peer = node_hosts[peer_name]
    # The registry and the rsync daemon take any connection; the rendezvous port is left out: a bare
    # connection to it is a rank that failed its hello, and the pair stops (its rule is proven by the
    # live table being the rendered one).
    ports = [p for p in fabric_ports(cluster, node) if p != node_profile(cluster.head).master_port]
    listening = [p for p in ports if node_hosts[node.name].socket(f"tcp://{p}").is_listening
                 or node_hosts[node.name].socket(f"tcp://{node.fabric_ip}:{p}").is_listening]
    assert listening, f"{node.name}: none of {ports} listens; nothing to prove"
    refused = sorted(set(listening) - set(tcp_open(peer, node.fabric_ip, listening)))
    assert not refused, f"{peer_name} -> {node.fabric_ip} ports {refused} over the fabric refused"
    route = f"{node.fabric_ip}/32 via {node.management_address} table {PROBE_TABLE}"
    rule = f"fwmark {PROBE_MARK} lookup {PROBE_TABLE} priority {PROBE_TABLE}"
    peer.run(f"ip route replace {route} && ip rule add {rule}")
    try:
        via = peer.check_output(f"ip route get {node.fabric_ip} mark {PROBE_MARK}")
        assert f" via {node.management_address} " in via, via
        reached = tcp_open(peer, node.fabric_ip, listening, mark=PROBE_MARK)
    finally:
        peer.run(f"ip rule del {rule}; ip route del {route}")
    assert not reached, f"{node.name}: {node.fabric_ip} ports {reached} answer through {node.management_address}"


def test_the_api_answers_only_the_allowed_networks(host, node, cluster, profile, node_hosts):
    """From a peer's management address: 401 (reached, the key is required) when it is in the
    allowed networks, no answer at all when it is not."""
    if not node.is_head or not node.firewall_enabled:
        pytest.skip("the API is on the head")
    networks = [ip_network(n) for n in api_networks(node, subnet_of(host, node))]
    checked = 0
    for peer_node in cluster.peers(node):
        peer = node_hosts.get(peer_node.name)
        try:
            source = ip_address(peer_node.management_address)
        except ValueError:
            continue
        if peer is None:
            continue
        # TLS: the peer (a worker has no bundle of its own) verifies with the head's, copied to it
        verify = ""
        if node.tls_enabled:
            peer.run(f"cat > /tmp/sparkfleet-state-ca.crt << 'EOF'\n{host.check_output(f'cat {ca_bundle_path(node)}')}\nEOF")
            verify = "--cacert /tmp/sparkfleet-state-ca.crt "
        code = peer.run(f"curl {verify}-sS -m 5 -o /dev/null -w '%{{http_code}}' "
                        f"{api_base(node, profile.port)}/v1/models").stdout.strip()
        want = "401" if any(source in n for n in networks) else "000"
        assert code == want, (f"{peer_node.name} ({source}) -> the API: {code}, want {want} (allowed: "
                              f"{', '.join(map(str, networks))})")
        checked += 1
    assert checked, "no peer with an IP management address to try from"


def test_the_registry_refuses_deletes(host, node, profile):
    if not node.is_head:
        pytest.skip("the registry is on the head")
    url = (f"http://{node.fabric_ip}:{node.docker_registry_port}/v2/{profile.image}/manifests/"
           f"sha256:{'0' * 64}")
    code = host.run(f"curl -sS -m 5 -o /dev/null -w '%{{http_code}}' -X DELETE {url}").stdout.strip()
    assert code == "405", f"{node.name}: DELETE on the registry answered {code}, want 405 (deletes disabled)"
