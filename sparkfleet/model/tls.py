"""Data of roles/tls: TLS on the head's API (the API proxy terminates it), and the files every client of
the API verifies the certificate with.

By default sparkfleet keeps a private CA for the fleet: created once by the deploy on one node
(`tls_ca_node`, else the first serving group's head), its key root-only there
(<serving_dir>/tls/ca/ca.key, 0600 in a 0700 directory) and never read by the controller or copied
anywhere; each head's server certificate is issued by it for the head's management address (an IP
SAN: clients reach nodes by address, sparkfleet/addresses.py) and issued again by the deploy when it is
within `tls_renew_before_days` of its end, names other addresses, or another CA issued it. A site that
has its own PKI names root-only files on each head instead (`tls_cert_file`, `tls_key_file`, with
`tls_cert_ca_file`, the CA clients verify them with). Plain HTTP only when data turns TLS off with a
reason (`tls_enabled = False`, `tls_disabled_reason`).

Every node that serves the API or speaks to it (each head; the router node) holds the fleet's trust
bundle at <serving_dir>/tls/ca.crt: the fleet CA's certificate, or the heads' `tls_cert_ca_file`s.
Clients on the LAN fetch it from a head (`ssh root@<head> cat /etc/sparkfleet/tls/ca.crt`) and compare its
SHA-256 fingerprint with the one the deploy prints.

Part of sparkfleet/config.py's NodeConfig; tls_problems() runs with the other checks across nodes.
On the ground floor: the paths and URLs here are what roles/api_proxy, roles/serving, roles/receipt,
roles/router and the tools read; roles/tls decides and issues.
"""
from __future__ import annotations

import shlex

from pydantic import BaseModel, Field

from sparkfleet.refusal import Problem, shared_key_problems

# Fleet-wide: one CA, one lifetime policy, TLS on or off for every API.
TLS_SHARED_KEYS = ("tls_enabled", "tls_disabled_reason", "tls_ca_node", "tls_ca_days", "tls_cert_days",
                   "tls_renew_before_days")
# Per head: a site's own certificate, its key and the CA that verifies it (all three, or none).
SITE_KEYS = ("tls_cert_file", "tls_key_file", "tls_cert_ca_file")


class TlsData(BaseModel):
    tls_enabled: bool = Field(
        True, description="TLS on each head's API (the API proxy terminates it; the engine stays on loopback behind "
        "it); false: plain HTTP, only with `tls_disabled_reason`. The same on every node. See "
        "docs/security.md#tls-on-the-api"
    )
    tls_disabled_reason: str | None = Field(
        None, description="why the API speaks plain HTTP: required when `tls_enabled` is false (printed at every "
        "deploy), refused when it is true"
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
        365, ge=2, le=3650, description="days a server certificate the fleet CA issues is valid"
    )
    tls_renew_before_days: int = Field(
        30, ge=1, description="a deploy issues a head's certificate again when fewer days than this are left; must "
        "be less than `tls_cert_days`"
    )
    tls_cert_file: str | None = Field(
        None, pattern=r"^/", description="your own certificate instead of the fleet CA's, on the head: a PEM file with the "
        "server certificate first, then its intermediates; it must name the head's management address as an IP "
        "SAN. With `tls_key_file` and `tls_cert_ca_file`. The deploy never renews it",
        json_schema_extra={"set_in": "inventory, per node"},
    )
    tls_key_file: str | None = Field(
        None, pattern=r"^/", description="the private key of `tls_cert_file`, on the head: a root-only file (mode 0600 or "
        "stricter)", json_schema_extra={"set_in": "inventory, per node"},
    )
    tls_cert_ca_file: str | None = Field(
        None, pattern=r"^/", description="the CA certificate(s) that verify `tls_cert_file`, on the head (PEM): what sparkfleet's "
        "clients, the router and yours verify the head with", json_schema_extra={"set_in": "inventory, per node"},
    )


TLS_KEYS = tuple(TlsData.model_fields)

# The directory of the TLS files on every node that serves the API or speaks to it, and in it: the
# trust bundle (public), the API proxy's PEM (certificate, then key: HAProxy's `crt`, root-only), and
# the CA's own directory on the CA node (the key; 0700).
TLS_SUBDIR = "tls"
CA_BUNDLE = "ca.crt"
PROXY_PEM = "api.pem"
CA_SUBDIR = "ca"
CA_KEY = "ca.key"


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


def site_certs(node) -> bool:
    """The head serves the site's own certificate (tls_cert_file), not one of the fleet CA's."""
    return node.tls_cert_file is not None


def ca_node_name(nodes) -> str | None:
    """The node that keeps the fleet CA: data's, else the first serving group's head; None when TLS is
    off or every head serves its site's own certificate (no CA is needed)."""
    nodes = list(nodes)
    if not nodes or not nodes[0].tls_enabled:
        return None
    if all(site_certs(n) for n in nodes if n.rank == 0):
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
    certificate named with its key and CA file (each on a head)."""
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
        if not n.is_head:
            problems.append(Problem(
                f"key '{given[0]}' on a node that is not a head (rank {n.rank}): only a head serves the API",
                [n.name], key=given[0], fix="set it on the head of the group, or remove it"))
        elif len(given) != len(SITE_KEYS):
            missing = [k for k in SITE_KEYS if k not in given]
            problems.append(Problem(
                f"key{'s' * (len(given) > 1)} {', '.join(repr(k) for k in given)} without "
                f"{', '.join(repr(k) for k in missing)}: a site's certificate needs its key and the CA clients "
                f"verify it with; allowed: all of {', '.join(SITE_KEYS)}, or none (the fleet CA issues the head's)",
                [n.name], key=missing[0], fix=f"set {', '.join(missing)} too, or remove {', '.join(given)}"))
    return problems
