"""What roles/router writes on the router node, as pure functions of the fleet (a test renders what a
deploy writes): which groups it routes to, its JSON config and its unit (its gate: roles/router/gate.py).

smg listens on the router node's loopback (router_smg_port), behind its gate on router_port; with TLS on
it is given no API key and presents the router hop's own client certificate to the heads
(client_cert_file, docs/security.md#the-router-hop), not the node's certificate its gate serves.

Backends: the head of every serving group whose profile serves the same API model name as the router
node's own group (the name clients send as "model"; smg routes by it), each at
https://<head's management address>:<its profile's port> (http:// with tls_enabled false), its
certificate verified against the fleet's trust bundle on the router node. The management address, not the fabric's:
groups cabled back to back share no fabric (each cable is its own subnet, and each node's firewall
takes only its own group's fabric addresses on the fabric netdev), while every head's API already
listens on all addresses and is reached from the management network (firewall_api_allowed_networks,
by default the management subnet the router node is on). The address is an IP literal, pinned on the
controller before any connection (sparkfleet/addresses.py): the router node resolves no name, so no
LAN host that answers for one receives the fleet key or the prompts.
"""
import json

from sparkfleet.model.router import RouterData
from sparkfleet.model.api_key import key_file
from sparkfleet.model.serving import node_profile
from sparkfleet.model.tls import api_base, ca_bundle_path, client_cert_path
from sparkfleet.render import render

ROUTER_UNIT = "sparkfleet-router"
UNIT_PATH = f"/etc/systemd/system/{ROUTER_UNIT}.service"
SFL_ROUTER = "/usr/local/libexec/sparkfleet/sfl_router.py"
ROUTER_CONFIG = "/etc/sparkfleet/router.json"
# smg's control-plane key (worker add/remove/list and its admin routes; sfl_router.py): generated on
# the router node, root-only, and never handed to a client or written anywhere else. The API key
# (key_file) is refused on those routes.
CONTROL_KEY_FILE = "/etc/sparkfleet/router-control-key"
# On the router node: one virtualenv per smg version (a bump is a new venv and a new unit), and
# where the controller ships the wheel before pip installs it.
VENV_ROOT = "/usr/local/lib/sparkfleet"
WHEEL_DIR = "/var/lib/sparkfleet/router"  # not the controller's cache: the controller may be the router node
HEALTH_ENDPOINT = "/health"
POLICY = "cache_aware"  # smg's default: a prompt's prefix goes where its KV cache is
REQUEST_TIMEOUT_S = 1800  # smg's default; one request's bound through the router (a long generation)


def venv_dir(version: str) -> str:
    return f"{VENV_ROOT}/router-smg-{version}"


def router_node(fleet):
    """The node named by router_node, or None (no router)."""
    name = fleet.nodes[0].router_node if fleet.nodes else None
    return None if name is None else fleet.node(name)


def served_name(group) -> str:
    return node_profile(group.head).api_model_name


def routed_groups(fleet, router) -> dict:
    """group name -> the group (a ClusterConfig), for every group serving the router group's model."""
    model = served_name(fleet.group_of(router.name))
    return {name: g for name, g in fleet.groups.items() if served_name(g) == model}


def router_of(fleet, head):
    """The router node when the router routes to `head`'s group (its head then admits the router hop:
    roles/api_proxy router_hop), else None."""
    router = router_node(fleet)
    if router is None or not head.is_head:
        return None
    return router if head.serving_group in routed_groups(fleet, router) else None


def key_holders(fleet):
    """(the fleet key's source: the router group's head, [every other node that holds it: each routed
    group's head, and the router node]), or None without a router (roles/router/fleet_key.py)."""
    router = router_node(fleet)
    if router is None:
        return None
    source = fleet.group_of(router.name).head
    nodes = [g.head for g in routed_groups(fleet, router).values() if g.head.name != source.name]
    if router.name not in {source.name, *(n.name for n in nodes)}:
        nodes.append(router)
    return source, nodes


def backend_url(head) -> str:
    """How the router names a group's head: its API on the management address, over TLS unless data
    turns it off (smg verifies the head's certificate, for that address, against the fleet's trust
    bundle on the router node: router_config's ca_file)."""
    return api_base(head, node_profile(head).port)


def backends(fleet, router) -> list[str]:
    return [backend_url(g.head) for g in routed_groups(fleet, router).values()]


def router_config(fleet, router: RouterData) -> dict:
    """The router node's /etc/sparkfleet/router.json (sfl_router.py reads it)."""
    return {
        # smg on loopback only, behind the router's gate on router_port (roles/router/gate.py): only root's
        # and the gate's sockets reach it (roles/firewall).
        "listen_host": "127.0.0.1",
        "port": router.router_smg_port,
        "backends": backends(fleet, router),
        # The fleet's key (the gate checks it; sfl_router.py refuses a control-plane key equal to it). smg
        # itself is given it only without client_cert_file (TLS off).
        "key_file": key_file(router),
        # The router hop's credential (docs/security.md#the-router-hop): its own client certificate from the
        # fleet CA (clientAuth only, CN sparkfleet-router-hop), then its key, one root-only file that roles/tls
        # issues on the router node and never copies (the node's certificate, which the exporters' copy
        # holds, is no client's), which smg presents to every head (smg's client_cert_path and
        # client_key_path: model_gateway/src/config/builder.rs read_mtls_certificates joins the two files
        # into reqwest's Identity; one file holding both serves). None: TLS off, smg presents the fleet's
        # key instead.
        "client_cert_file": client_cert_path(router),
        "control_key_file": CONTROL_KEY_FILE,
        "health_check_endpoint": HEALTH_ENDPOINT,
        "health_check_interval_s": router.router_health_check_interval_s,
        "health_check_timeout_s": router.router_health_check_timeout_s,
        "health_failure_threshold": router.router_health_failure_threshold,
        "health_success_threshold": router.router_health_success_threshold,
        "policy": POLICY,
        "request_timeout_s": REQUEST_TIMEOUT_S,
        "log_level": "info",
        # smg's Prometheus exporter (smg/router_args.py prometheus_host/prometheus_port: by default on
        # every address, port 29000): on loopback only until a scrape source is named.
        "metrics_host": "127.0.0.1",
        "metrics_port": router.router_metrics_port,
        # The only CA smg adds to its roots for the heads' certificates (smg's ca_cert_paths: reqwest's
        # add_root_certificate on every worker's client, model_gateway/src/worker/http_client.rs); roles/tls
        # writes it on the router node. None: the heads speak plain HTTP (tls_enabled false).
        "ca_file": ca_bundle_path(router) if router.tls_enabled else None,
    }


def config_text(fleet, router) -> str:
    return json.dumps(router_config(fleet, router), indent=1, sort_keys=True) + "\n"


def unit_text(fleet, router) -> str:
    return render("router", UNIT_PATH, version=router.router_version, backends=backends(fleet, router),
                  model=served_name(fleet.group_of(router.name)), port=router.router_smg_port,
                  python=f"{venv_dir(router.router_version)}/bin/python", program=SFL_ROUTER, config=ROUTER_CONFIG,
                  firewall_enabled=router.firewall_enabled)
