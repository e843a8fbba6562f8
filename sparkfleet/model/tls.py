"""Data of roles/tls: TLS on every listener a person or another node reaches over the LAN (each head's API
and its engine's /metrics, which the API proxy terminates; the router's gate on the router node; with
monitoring on, every node's node exporter and a GPU node's GPU exporter), and the files every client
verifies the certificate with.

By default sparkfleet keeps a private CA for the fleet: created once by the deploy on one node
(`tls_ca_node`, else the first serving group's head), its key root-only there
(<serving_dir>/tls/ca/ca.key, 0600 in a 0700 directory) and never read by the controller or copied
anywhere. Each node with a listener on the LAN (serves_tls) holds one server certificate, for its
management address (an IP SAN: clients reach nodes by address, sparkfleet/addresses.py), which every TLS
listener of that node serves; the CA issues it, and issues it again when it is within
`tls_renew_before_days` of its end, names other addresses, or another CA issued it. A site that has its
own PKI names root-only files on each such node instead (`tls_cert_file`, `tls_key_file`, with
`tls_cert_ca_file`, the CA clients verify them with). Plain HTTP only when data turns TLS off with a
reason (`tls_enabled = False`, `tls_disabled_reason`).

The router node is one more certified node (roles/router: its gate, HAProxy, terminates TLS on
router_port in front of smg), with the same one server certificate as every node (serverAuth only). smg's
credential to the heads is not that certificate: on the router node the fleet CA issues a second one, the
router hop's (docs/security.md#the-router-hop): a client certificate (clientAuth only, its CN HOP_CN, no
address) and its key in HOP_PEM, root-only, which smg alone presents (client_cert_path) and which is never
copied (not to the exporters, whose copy of the node's certificate group prometheus reads, nor anywhere
else). Each routed head admits exactly that CN, from the router node's address. The router node's own
certificate may then be a site's like any node's; with a router the fleet CA is made all the same, for
the hop's.

Every node that serves TLS or speaks to a node that does (each certified node; the router node)
holds the fleet's trust bundle at <serving_dir>/tls/ca.crt: the fleet CA's certificate, or the nodes'
`tls_cert_ca_file`s; the monitoring node a copy Prometheus reads (SCRAPE_CA). Clients on the LAN fetch it
from a head (`ssh root@<head> cat /etc/sparkfleet/tls/ca.crt`) and compare its SHA-256 fingerprint with
the one the deploy prints.

Part of sparkfleet/config.py's NodeConfig; tls_problems() runs with the other checks across nodes.
On the ground floor: the paths and URLs here are what roles/api_proxy, roles/serving, roles/receipt,
roles/router and the tools read; roles/tls decides and issues.
"""
from __future__ import annotations

import shlex

from pydantic import BaseModel, Field

from sparkfleet.model.monitoring import PROMETHEUS_USER
from sparkfleet.refusal import Problem, shared_key_problems

# Fleet-wide: one CA, one lifetime policy, TLS on or off for every listener.
TLS_SHARED_KEYS = ("tls_enabled", "tls_disabled_reason", "tls_ca_node", "tls_ca_days", "tls_cert_days",
                   "tls_renew_before_days")
# Per node with a listener on the LAN: a site's own certificate, its key and the CA that verifies it (all
# three, or none).
SITE_KEYS = ("tls_cert_file", "tls_key_file", "tls_cert_ca_file")


class TlsData(BaseModel):
    tls_enabled: bool = Field(
        True, description="TLS on every listener reached over the LAN: each head's API and its engine's `/metrics` (the "
        "API proxy terminates it; the engine stays on loopback behind it), the router's gate on `router_node` and, "
        "with `monitoring_enabled`, every node's node exporter and a GPU node's GPU exporter, each node with one certificate for its management "
        "address; Prometheus verifies them. False: plain HTTP, only with `tls_disabled_reason`. The same on every "
        "node. See docs/security.md#tls-on-the-api"
    )
    tls_disabled_reason: str | None = Field(
        None, description="why the API and the exporters speak plain HTTP: required when `tls_enabled` is false "
        "(printed at every deploy), refused when it is true"
    )
    tls_ca_node: str | None = Field(
        None, description="the inventory name of the node that keeps the fleet's private CA (its key root-only "
        "there, never copied); none: the first serving group's head. Changing it makes a new CA: every client must "
        "fetch the new `ca.crt`"
    )
    tls_ca_days: int = Field(
        3650, ge=30, le=36500, description="days the fleet CA sparkfleet creates is valid (it is never renewed by "
        "the deploy: clients pinned it; the plan warns within `tls_renew_before_days` of its end)"
    )
    tls_cert_days: int = Field(
        365, ge=2, le=3650, description="days a node's server certificate the fleet CA issues is valid"
    )
    tls_renew_before_days: int = Field(
        30, ge=1, description="a deploy issues a node's certificate again when fewer days than this are left; must "
        "be less than `tls_cert_days`"
    )
    tls_cert_file: str | None = Field(
        None, pattern=r"^/", description="your own certificate instead of the fleet CA's, on the node (a head, or any "
        "node with `monitoring_enabled`, the router node among them: every TLS listener of the node serves it): a PEM file with the server "
        "certificate first, then its intermediates; it must name the node's management address as an IP SAN. With "
        "`tls_key_file` and `tls_cert_ca_file`. The deploy never renews it",
        json_schema_extra={"set_in": "inventory, per node"},
    )
    tls_key_file: str | None = Field(
        None, pattern=r"^/", description="the private key of `tls_cert_file`, on the node: a root-only file (mode 0600 or "
        "stricter)", json_schema_extra={"set_in": "inventory, per node"},
    )
    tls_cert_ca_file: str | None = Field(
        None, pattern=r"^/", description="the CA certificate(s) that verify `tls_cert_file`, on the node (PEM): what "
        "sparkfleet's clients, the router, Prometheus and yours verify the node with", json_schema_extra={"set_in": "inventory, per node"},
    )


TLS_KEYS = tuple(TlsData.model_fields)

# The directory of the TLS files on every node that serves TLS or speaks to it, and in it: the trust
# bundle (public), the node's server PEM (certificate, then key: HAProxy's `crt`, which every TLS
# listener of the node serves; root-only; `api.pem` since the API was its first), and the CA's own
# directory on the CA node (the key; 0700).
TLS_SUBDIR = "tls"
CA_BUNDLE = "ca.crt"
PROXY_PEM = "api.pem"
CA_SUBDIR = "ca"
CA_KEY = "ca.key"
# The router hop's client certificate, then its key, on the router node only: root-only (0600) in the 0700
# <tls>, read by smg (as root) alone; its own key, made on the node like a node's, never copied. Its
# subject's CN is HOP_CN (no node's name: a node's certificate names the node), the one CN a routed head's
# gate admits without the key, from the router node's address (roles/api_proxy router_hop).
HOP_PEM = "router-hop.pem"
HOP_CN = "sparkfleet-router-hop"


# The exporters' copy of the node's PEM: the node exporter runs as user prometheus (the OS's unit), which
# cannot enter <serving_dir> (root 0700). A copy root:prometheus 0640 in a directory root:prometheus 0750,
# made by roles/tls after every new certificate: group-readable, not the prometheus user's own file, so that
# the daemon reads the key but can neither replace it nor plant anything where root writes (issue 43 item
# 5); the GPU exporter (root, in its container) mounts the directory read-only. With it, the exporters'
# web configuration (exporter-toolkit's --web.config.file, roles/monitoring renders it), and on the
# monitoring node the trust bundle Prometheus verifies every target with (public, 0644).
EXPORTER_TLS_DIR = "/etc/prometheus/sparkfleet-tls"
EXPORTER_PEM = f"{EXPORTER_TLS_DIR}/node.pem"
EXPORTER_WEB_CONFIG = f"{EXPORTER_TLS_DIR}/web-config.yml"
SCRAPE_CA = f"{EXPORTER_TLS_DIR}/ca.crt"
EXPORTER_GROUP = PROMETHEUS_USER


def exporter_tls(node) -> bool:
    """The node's exporters speak TLS with the node's certificate (roles/monitoring), from the copy in
    EXPORTER_TLS_DIR."""
    return node.tls_enabled and node.monitoring_enabled


def tls_dir(node) -> str:
    return f"{node.serving_dir}/{TLS_SUBDIR}"


def ca_bundle_path(node) -> str:
    """The fleet's trust bundle on `node`: what every sparkfleet client on it verifies the API with."""
    return f"{tls_dir(node)}/{CA_BUNDLE}"


def proxy_pem_path(node) -> str:
    return f"{tls_dir(node)}/{PROXY_PEM}"


def ca_key_dir(node) -> str:
    return f"{tls_dir(node)}/{CA_SUBDIR}"


def ca_key_path(node) -> str:
    return f"{ca_key_dir(node)}/{CA_KEY}"


def hop_pem_path(node) -> str:
    """Where the router hop's certificate and key are on `node` (the router node holds them; any other node
    had them when it was the router node, and they are removed: roles/router)."""
    return f"{tls_dir(node)}/{HOP_PEM}"


def site_certs(node) -> bool:
    """The node serves the site's own certificate (tls_cert_file), not one of the fleet CA's."""
    return node.tls_cert_file is not None


def is_router_node(node) -> bool:
    return node.router_node is not None and node.router_node == node.name


def serves_tls(node) -> bool:
    """The node holds a server certificate (with TLS on), one for its management address that all its TLS
    listeners serve: it has a listener others reach over the LAN. A head (the API proxy: the API, the
    engine's /metrics), the router node (the router's gate) and, with monitoring
    on, every node (its node exporter; a GPU node's GPU exporter)."""
    return node.tls_enabled and (node.is_head or is_router_node(node) or node.monitoring_enabled)


def client_cert_path(node) -> str | None:
    """The client certificate (then its key, one root-only file) smg presents to the heads on the router node:
    the router hop's own (hop_pem_path), which the fleet CA issues there with clientAuth only (roles/tls);
    None with TLS off, and on any other node."""
    return hop_pem_path(node) if node.tls_enabled and is_router_node(node) else None


def ca_node_name(nodes) -> str | None:
    """The node that keeps the fleet CA: data's, else the first serving group's head; None when TLS is
    off, or every certified node serves its site's own certificate and there is no router (no CA is
    needed; the router hop's client certificate is always the fleet CA's, so with a router the CA is made)."""
    nodes = list(nodes)
    if not nodes or not nodes[0].tls_enabled:
        return None
    if not any(is_router_node(n) for n in nodes) and all(site_certs(n) for n in nodes if serves_tls(n)):
        return None
    if nodes[0].tls_ca_node:
        return nodes[0].tls_ca_node
    heads = sorted((n for n in nodes if n.rank == 0), key=lambda n: (n.serving_group, n.name))
    return heads[0].name if heads else None


def scheme(node) -> str:
    return "https" if node.tls_enabled else "http"


def host_part(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def api_base(head, port: int) -> str:
    """The head's API as every client names it: its management address (the IP SAN of its certificate)."""
    return f"{scheme(head)}://{host_part(head.management_address)}:{int(port)}"


def curl_tls(node) -> str:
    """curl's options that verify the API's certificate against the node's trust bundle ('' when TLS is
    off). Every sparkfleet probe of the API through the proxy uses them: never -k."""
    return f"--cacert {shlex.quote(ca_bundle_path(node))}" if node.tls_enabled else ""


def tls_problems(nodes) -> list[Problem]:
    """TLS's checks across nodes, before any connection: one setting for the fleet, a reason when it is
    off, a CA node of the inventory, a renewal window shorter than a certificate's life, a site's
    certificate named with its key and CA file (each on a node with a TLS listener)."""
    nodes = list(nodes)
    problems = shared_key_problems(nodes, TLS_SHARED_KEYS, "the fleet has one TLS setting and one CA")
    if problems or not nodes:
        return problems
    first, names = nodes[0], [n.name for n in nodes]
    if not first.tls_enabled:
        if not (first.tls_disabled_reason or "").strip():
            problems.append(Problem(
                "key 'tls_enabled' = False without key 'tls_disabled_reason': the API (and the key in every "
                "request) would cross the LAN in plain HTTP; allowed: tls_enabled = True, or False with a reason",
                names, key="tls_disabled_reason",
                fix="keep tls_enabled = True, or set tls_disabled_reason = \"<why>\" (printed at every deploy)"))
        return problems
    if first.tls_disabled_reason is not None:
        problems.append(Problem(
            f"key 'tls_disabled_reason' = {first.tls_disabled_reason!r} while tls_enabled is true: nothing is "
            f"disabled", names, key="tls_disabled_reason", fix="remove it, or set tls_enabled = False"))
    if first.tls_renew_before_days >= first.tls_cert_days:
        problems.append(Problem(
            f"key 'tls_renew_before_days' = {first.tls_renew_before_days} is not less than tls_cert_days = "
            f"{first.tls_cert_days}: every deploy would issue the certificates again; allowed: 1 to "
            f"{first.tls_cert_days - 1}", names, key="tls_renew_before_days",
            fix="lower tls_renew_before_days, or raise tls_cert_days"))
    if first.tls_ca_node is not None and first.tls_ca_node not in names:
        problems.append(Problem(
            f"key 'tls_ca_node' = {first.tls_ca_node!r} is not a node of the inventory; allowed: "
            f"{', '.join(sorted(names))} (or none: the first serving group's head)", names, key="tls_ca_node",
            fix="name one of the inventory's nodes"))
    for n in nodes:
        given = [k for k in SITE_KEYS if getattr(n, k) is not None]
        if not given:
            continue
        if not serves_tls(n):
            problems.append(Problem(
                f"key '{given[0]}' on a node with no listener on the LAN (rank {n.rank}, monitoring_enabled false): "
                f"only a head, the router node, or any node when monitoring is on, serves TLS with a site's certificate", [n.name], key=given[0],
                fix="set it on the head of the group, or remove it"))
        elif len(given) != len(SITE_KEYS):
            missing = [k for k in SITE_KEYS if k not in given]
            problems.append(Problem(
                f"key{'s' * (len(given) > 1)} {', '.join(repr(k) for k in given)} without "
                f"{', '.join(repr(k) for k in missing)}: a site's certificate needs its key and the CA clients "
                f"verify it with; allowed: all of {', '.join(SITE_KEYS)}, or none (the fleet CA issues the node's)",
                [n.name], key=missing[0], fix=f"set {', '.join(missing)} too, or remove {', '.join(given)}"))
    return problems
