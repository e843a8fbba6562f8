"""The firewall rules of one node (roles/firewall writes and applies them), rendered from data and
the cluster alone.

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
  - the exporters (roles/monitoring: the node exporter, the engine's /metrics on a head) from the
    monitoring node's address only.
SSH is never matched. Loopback is always accepted by the input chain: what a local user may reach is
the output chain's (issue 43 item 4), which judges each connection a local socket opens by the user
that socket belongs to (nft(8), META EXPRESSIONS: `skuid`, "UID associated with originating
socket"; a container on the host's network is in the node's network namespace, its process's uid
the socket's). A connection to a local address, whatever that address, leaves through the output
hook and arrives over `lo`, so these match the destination (port or address), never the interface:
  - on the head, the engine's own port (loopback only, behind the API proxy) from root's and the
    proxy's sockets only (a local user cannot go around the proxy); on the router node, smg's own
    port (loopback only, behind the router's gate, roles/router/gate.py) likewise: smg answers some
    routes without a key, and holds none itself with TLS on;
  - the rendezvous, registry, rsync and speed-proof ports on any of the node's own addresses
    (loopback, management, fabric, Docker's bridge): root's sockets only;
  - every fabric address of the group (the node's own and its peers', any port, any protocol:
    NCCL's, gloo's and vLLM's sockets on them): root's sockets only;
  - on the monitoring node, Prometheus' and Alertmanager's ports: root's and their own user's.
"""
from ipaddress import ip_address

from sparkfleet.model.api_proxy import PROXY_USER
from sparkfleet.model.monitoring import PROMETHEUS_USER
from sparkfleet.model.serving import node_profile
from sparkfleet.render import render, sha1_text

# Who may connect to the head's engine port on loopback: root (the deploy's probes, the watchdog, the
# engine's own processes) and the API proxy's workers. The engine holds no key (the proxy checks it),
# so anyone else on the head would reach every route it serves; they go through the proxy like the LAN.
# The same two for smg's port on the router node: root (sfl_router.py's admin calls, the deploy) and the
# router's gate, HAProxy's workers as the same user.
ENGINE_PORT_USERS = ("root", PROXY_USER)
# Who may open a connection to the fabric's services and to any fabric address: root alone. Every real
# client is root's: the engines' ranks and the speed proof's collective (containers on the host's
# network, run as root), iperf3 and ib_write_bw, dockerd's push and pulls, a worker's weights pull over
# HTTP (sfl_files.py pull, root's), every rsync between nodes
# (fan-out, kernel caches, the watchdog's read of a peer's state), the fabric's pings.
FABRIC_USERS = ("root",)
# Who may reach Prometheus and Alertmanager on the monitoring node's loopback: root (the doctor,
# `sparkfleet status`, the state checks, an SSH tunnel as root) and the user both daemons run as
# (Prometheus sends its alerts to Alertmanager as it; it owns both daemons' data already). Anyone else
# could silence every alert, inject alerts or read the receivers' settings.
MONITORING_USERS = ("root", PROMETHEUS_USER)


def fabric_ports(cluster, node) -> list[int]:
    profile = node_profile(cluster.head)
    # fabric_speed_port: iperf3's server and the speed proof's rendezvous (roles/fabric_speed).
    return sorted({profile.master_port, node.docker_registry_port, node.fanout_rsync_port, node.fanout_http_port,
                   node.fabric_speed_port})


def fabric_addresses(cluster) -> list[str]:
    """Every fabric address of the group, each half's, this node's and its peers' (the output chain's)."""
    return sorted({half.ip for n in cluster.nodes for half in n.fabric_halves}, key=ip_address)


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


def monitoring_local_ports(node, monitor: str | None) -> list[int]:
    """Prometheus' and Alertmanager's ports, on the monitoring node only: the one whose management
    address is the monitoring node's (`monitor`, roles/firewall's monitor_address)."""
    if not node.monitoring_enabled or monitor is None or monitor != node.management_address:
        return []
    return [node.monitoring_prometheus_port] + (
        [node.monitoring_alertmanager_port] if node.monitoring_alertmanager_enabled else [])


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
        smg_port=node.router_smg_port if node.router_node == node.name else None,
        monitor_ports=monitor_ports(node) if monitor else [], monitor=monitor,
        fabric_users=FABRIC_USERS, fabric_addresses=fabric_addresses(cluster),
        monitoring_ports=monitoring_local_ports(node, monitor), monitoring_users=MONITORING_USERS,
    )


def rules_text(cluster, node, management_subnet: str | None, monitor: str | None = None) -> str:
    """The node's ruleset file. Its first rule carries `sparkfleet <sha1 of the rules>` as a comment,
    so the live table is compared with what data renders (a hand-flushed table is re-applied).
    `monitor`: the monitoring node's IPv4 address as this node resolves it (None: no monitoring)."""
    return _body(cluster, node, management_subnet, f"sparkfleet {digest(cluster, node, management_subnet, monitor)}",
                 monitor)


def digest(cluster, node, management_subnet: str | None, monitor: str | None = None) -> str:
    return sha1_text(_body(cluster, node, management_subnet, "sparkfleet", monitor))


def wanted_marker_of(cluster, node, subnet: str | None, monitor: str | None) -> str:
    """roles/firewall's wanted_marker from its facts: the management subnet and the monitoring node's
    address as the node resolves it (roles/firewall's monitor_address)."""
    return f"sparkfleet {digest(cluster, node, subnet, monitor)}"
