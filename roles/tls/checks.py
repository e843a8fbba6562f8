"""roles/tls: the fleet's private CA, each node's server certificate (one per node with a listener on the
LAN, for its management address: sparkfleet/model/tls.py serves_tls), and every node's trust bundle,
with openssl on the nodes: the reader of the plan's facts pass (tls_facts), the verdict (decide: a
TlsPlan, taken once at step 1b), the plan's lines, and the commands and operation bodies that create,
issue and write (roles/tls/tasks.py runs them as the plan says).

What is where (sparkfleet/model/tls.py names the paths; `<tls>` is <serving_dir>/tls, 0700 root):
  on the CA node     <tls>/ca/ca.key   the CA's key (EC P-256), 0600 in the 0700 directory <tls>/ca; read
                                       by openssl there only: it is in no fact, command line or log, and
                                       never leaves the node
                     <tls>/ca/ca.crt   the CA's certificate (public; CA:TRUE, pathlen 0, keyCertSign)
  on each node with   <tls>/api.pem    the node's certificate then its key (HAProxy's `crt`), 0600, which
  a TLS listener                       every TLS listener of the node serves (the API proxy's, the router's
  (certified)                          gate's, the exporters' through their copy): a new key per issue, made
                                       on the node (only its CSR and the signed certificate travel, both
                                       public), replaced whole by one rename
  on the router node  HOP_PEM          the router hop's client certificate then its key, 0600, which smg
                                       alone presents to the heads: issued and replaced like the node's, and
                                       never copied (no exporter, no group reads it)
                      EXPORTER_PEM     with monitoring on, the same bytes, root:prometheus 0640 in the
                                       0750 root:prometheus EXPORTER_TLS_DIR: the exporters' copy (the node
                                       exporter runs as prometheus and cannot enter <tls>); copied again
                                       after each new certificate, and when it differs or its owner or mode
                                       is not that
  on every node of    <tls>/ca.crt     the trust bundle (public): the CA's certificate (and the sites' CA
  scope()                              certificates, tls_cert_ca_file) that every client verifies with
  on the monitoring   SCRAPE_CA        the same bundle, 0644 in EXPORTER_TLS_DIR: what Prometheus (user
  node                                 prometheus) verifies every target with

A node's certificate names its management address as its only IP SAN (clients reach nodes by
address: sparkfleet/addresses.py), serverAuth only (the router node's too: want_usage), its subject
O=sparkfleet, CN=<the node's name>. The router hop's (hop_cert) names no address, clientAuth only, its
subject O=sparkfleet, CN=HOP_CN: a client's certificate that no listener serves, and the only one a
routed head admits without the key; no node's certificate is one (OpenSSL refuses a certificate without
clientAuth from a client: tests/unit/test_router_gate.py). A certificate is issued again when it is
missing, unreadable or not root-only, its key does not match it, fewer than tls_renew_before_days are
left, its SANs, extended key usages or subject are not what it is for, another CA issued it (its
authority key ID is not the CA's key ID) or it does not verify against the node's bundle for its use
(`openssl verify -purpose sslserver`, `sslclient` for the hop's): renewal_reasons, a pure function of
what the facts pass read. The CA itself is never renewed or replaced by a deploy (clients
pinned it): one that is missing its key, does not match it, or has expired stops the run at step 1b,
saying what to do; one close to its end is warned about.
"""
from __future__ import annotations

import base64
import hashlib
import secrets
import shlex
import time
from dataclasses import dataclass
from ipaddress import ip_address

from pyinfra import logger
from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import DeployError

from roles.router.node_config import router_node
from sparkfleet.keyfiles import connector_arguments
from sparkfleet.keyfiles import write as write_file
from sparkfleet.keyvalue import key_values
from sparkfleet.model.monitoring import monitoring_node_name
from sparkfleet.model.tls import (
    EXPORTER_GROUP, EXPORTER_PEM, EXPORTER_TLS_DIR, HOP_CN, SCRAPE_CA, ca_bundle_path, ca_key_dir, ca_key_path,
    ca_node_name, client_cert_path, exporter_tls, proxy_pem_path, serves_tls, site_certs, tls_dir,
)
from sparkfleet.once import fleet_hosts, fleet_slot, per_host
from sparkfleet.verdicts import TlsPlan

# EC P-256 keys for the CA and the servers: every TLS client (curl, Python's ssl, rustls in the router,
# Go, browsers) takes it, and a key is made in milliseconds on a Spark.
CURVE = "P-256"
DAY_S = 86400
# Extended key usages as openssl's config names them, and as `openssl x509 -ext extendedKeyUsage` prints
# them (spaces removed).
USAGE_NAMES = {"serverAuth": "TLSWebServerAuthentication", "clientAuth": "TLSWebClientAuthentication"}
ORGANIZATION = "sparkfleet"  # every certificate's subject O (the CA's included)


@dataclass(frozen=True)
class CertKind:
    """What one certificate from the fleet CA is for: its file on the node, its subject's CN, its extended
    key usages, its IP SANs (as parse_sans spells them), the purpose `openssl verify` checks it for, and the
    prefix of its lines in the facts (state_command)."""
    what: str  # as the plan and the logs name it
    pem: str
    cn: str
    usage: tuple[str, ...]
    sans: frozenset[str]
    purpose: str
    prefix: str

    @property
    def subject(self) -> str:
        """As `openssl x509 -subject -nameopt RFC2253` prints it (the last RDN first)."""
        return f"CN={self.cn},O={ORGANIZATION}"


def node_cert(node) -> CertKind:
    """The node's one server certificate: every TLS listener of the node serves it."""
    return CertKind("certificate", proxy_pem_path(node), node.name, want_usage(node), want_sans(node), "sslserver", "pem")


def hop_cert(node) -> CertKind | None:
    """The router hop's client certificate on the router node (smg presents it to the heads), else None."""
    path = client_cert_path(node)
    return None if path is None else CertKind("router hop's client certificate", path, HOP_CN, ("clientAuth",),
                                              frozenset(), "sslclient", "hop")


def ca_cert_path(node) -> str:
    """The CA's own certificate, beside its key (the bundle <tls>/ca.crt is a copy of it)."""
    return f"{ca_key_dir(node)}/ca.crt"


def certified(fleet) -> list:
    """The nodes that hold a server certificate: every node with a listener on the LAN (serves_tls: the
    heads, the router node, and with monitoring on every node), with TLS on; one certificate each, for its
    management address, served by all its TLS listeners."""
    return [n for n in fleet.nodes if serves_tls(n)]


def scope(fleet) -> list:
    """The nodes TLS touches: every certified node (its certificate, its bundle; on the router node the
    router hop's client certificate too, and its bundle what smg verifies the heads with) and the CA node,
    in name order."""
    names = {n.name for n in certified(fleet)}
    router = router_node(fleet)
    if router is not None:
        names.add(router.name)
    ca = ca_node_name(fleet.nodes)
    if ca is not None:
        names.add(ca)
    return [fleet.node(name) for name in sorted(names)]


# --- the facts ---------------------------------------------------------------------------------------

def _mode(var: str, path: str) -> str:
    """Shell: `<var>=<owner> <mode>` of a path, or `<var>=missing`."""
    q = shlex.quote(path)
    return f"if [ -e {q} ]; then echo \"{var}=$(stat -L -c '%U %a' {q})\"; else echo {var}=missing; fi"


def _cert_lines(prefix: str, cert: str, key: str, ca: str | None, untrusted: bool = False,
                purpose: str = "sslserver") -> str:
    """Shell: what the decision reads of one certificate file: its end (epoch seconds), SANs, authority key
    ID, extended key usages, subject, whether `key` (a file holding the private key) matches it, and
    `openssl verify` for `purpose` against `ca` (`untrusted`: the certificate file's own intermediates
    count). Public values only: the key is read by openssl on the node and only its public half is
    compared."""
    c, k = shlex.quote(cert), shlex.quote(key)
    lines = [
        f"e=$(openssl x509 -in {c} -noout -enddate 2>/dev/null | cut -d= -f2); "
        f"echo {prefix}_end=$([ -n \"$e\" ] && date -d \"$e\" +%s)",
        f"echo {prefix}_sans=$(openssl x509 -in {c} -noout -ext subjectAltName 2>/dev/null | tail -n +2 | tr -d ' \\n')",
        f"echo {prefix}_aki=$(openssl x509 -in {c} -noout -ext authorityKeyIdentifier 2>/dev/null | tail -n +2 "
        f"| sed 's/keyid://' | tr -d ' :\\n')",
        f"echo {prefix}_eku=$(openssl x509 -in {c} -noout -ext extendedKeyUsage 2>/dev/null | tail -n +2 | tr -d ' \\n')",
        f"echo {prefix}_subject=$(openssl x509 -in {c} -noout -subject -nameopt RFC2253 2>/dev/null | sed 's/^subject=//')",
        f"p=$(openssl x509 -in {c} -noout -pubkey 2>/dev/null); "
        f"if [ -n \"$p\" ] && [ \"$(openssl pkey -in {k} -pubout 2>/dev/null)\" = \"$p\" ]; then "
        f"echo {prefix}_match=yes; else echo {prefix}_match=no; fi",
    ]
    if ca is not None:
        a = shlex.quote(ca)
        extra = f" -untrusted {c}" if untrusted else ""
        lines.append(f"if [ -f {a} ]; then echo {prefix}_verify=$(openssl verify -purpose {purpose} -CAfile {a}{extra} "
                     f"{c} 2>&1 | tr '\\n' ' '); else echo {prefix}_verify=no CA file {a}; fi")
    return "; ".join(lines)


def state_command(node, ca: bool, scrape_ca: bool = False) -> str:
    """Shell, one round trip: what the verdict reads of `node` (`key=value` lines). `ca`: the node keeps the
    fleet CA; `scrape_ca`: the node runs Prometheus (its copy of the bundle). A certified node's
    certificate: the fleet CA's (<tls>/api.pem) or the site's (tls_cert_file);
    with its exporters on TLS, whether their copy is that PEM, byte for byte (cmp: no content printed), and
    its owner, group and mode. The router node's hop certificate (hop_cert) the same way as a node's."""
    bundle, pem = shlex.quote(ca_bundle_path(node)), shlex.quote(proxy_pem_path(node))
    parts = ["echo now=$(date +%s)", "command -v openssl >/dev/null && echo openssl=yes || echo openssl=no",
             f"if [ -f {bundle} ]; then echo bundle_sha=$(sha256sum < {bundle} | cut -c1-64); "
             f"else echo bundle_sha=missing; fi"]
    if ca:
        key, cert = ca_key_path(node), ca_cert_path(node)
        k, c = shlex.quote(key), shlex.quote(cert)
        parts += [
            _mode("ca_dir", ca_key_dir(node)), _mode("ca_key", key),
            f"if [ -f {c} ]; then echo ca_pem=$(base64 -w0 < {c}); "
            f"echo ca_fp=$(openssl x509 -in {c} -noout -fingerprint -sha256 2>/dev/null | cut -d= -f2); "
            f"e=$(openssl x509 -in {c} -noout -enddate 2>/dev/null | cut -d= -f2); "
            f"echo ca_end=$([ -n \"$e\" ] && date -d \"$e\" +%s); "
            f"echo ca_ski=$(openssl x509 -in {c} -noout -ext subjectKeyIdentifier 2>/dev/null | tail -n +2 | tr -d ' :\\n'); "
            f"p=$(openssl x509 -in {c} -noout -pubkey 2>/dev/null); "
            f"if [ -f {k} ] && [ -n \"$p\" ] && [ \"$(openssl pkey -in {k} -pubout 2>/dev/null)\" = \"$p\" ]; then "
            f"echo ca_match=yes; else echo ca_match=no; fi; else echo ca_pem=missing; fi",
        ]
    certified_node = serves_tls(node)
    if certified_node and site_certs(node):
        sc, sk, sca = node.tls_cert_file, node.tls_key_file, node.tls_cert_ca_file
        parts += [
            _mode("site_cert", sc), _mode("site_key", sk), _mode("site_ca", sca),
            f"if [ -f {shlex.quote(sca)} ]; then echo site_ca_pem=$(base64 -w0 < {shlex.quote(sca)}); fi",
            f"if [ -f {shlex.quote(sc)} ]; then {_cert_lines('site', sc, sk, sca, untrusted=True)}; fi",
            # the proxy's PEM is the site's certificate then its key, byte for byte
            f"if [ -f {pem} ] && cat {shlex.quote(sc)} {shlex.quote(sk)} 2>/dev/null | cmp -s - {pem}; then "
            f"echo pem_current=yes; else echo pem_current=no; fi",
            _mode("pem_mode", proxy_pem_path(node)),
        ]
    elif certified_node:
        parts.append(_issued_lines(node_cert(node), ca_bundle_path(node)))
    if (hop := hop_cert(node)) is not None:
        parts.append(_issued_lines(hop, ca_bundle_path(node)))
    if certified_node and exporter_tls(node):
        e = shlex.quote(EXPORTER_PEM)
        parts.append(f"if [ -f {e} ]; then if cmp -s {pem} {e}; then echo exporter_pem=current; "
                     f"else echo exporter_pem=differs; fi; echo \"exporter_pem_mode=$(stat -c '%U:%G %a' {e})\"; "
                     f"else echo exporter_pem=missing; fi")
    if scrape_ca:
        c = shlex.quote(SCRAPE_CA)
        parts.append(f"if [ -f {c} ]; then echo scrape_ca_sha=$(sha256sum < {c} | cut -c1-64); "
                     f"else echo scrape_ca_sha=missing; fi")
    return "; ".join(parts)


def _issued_lines(kind: CertKind, bundle: str) -> str:
    """Shell: the mode of a certificate file from the fleet CA (its certificate, then its key) and, when it
    exists, what _cert_lines reads of it."""
    p = shlex.quote(kind.pem)
    return (f"{_mode(kind.prefix + '_mode', kind.pem)}; "
            f"if [ -f {p} ]; then {_cert_lines(kind.prefix, kind.pem, kind.pem, bundle, purpose=kind.purpose)}; fi")


class TlsState(FactBase):
    """`key=value` lines of roles/tls/checks.py state_command: certificates' ends, SANs, key IDs,
    fingerprints, the modes of the key files, whether keys match; never a private key."""

    def command(self, script: str) -> str:
        return script

    def process(self, output):
        return key_values(output)


def tls_facts(state) -> dict[str, dict]:
    """The facts pass's reader (tools/plan.py read_facts), once per run: every node of scope() that is in
    the run, at once, one round trip each; {} with TLS off."""
    from sparkfleet.inventory import fleet_from_state

    with fleet_slot(state, "tls") as slot:
        if slot.done:
            return slot.value
        fleet = fleet_from_state(state)
        if not fleet.nodes or not fleet.nodes[0].tls_enabled:
            return slot.fill({})
        ca, monitor = ca_node_name(fleet.nodes), monitoring_node_name(list(fleet.nodes))
        wanted = {n.name for n in scope(fleet)}
        hosts = [h for h in fleet_hosts(state) if h.name in wanted]
        return slot.fill(per_host(state, lambda h: h.get_fact(
            TlsState, script=state_command(fleet.node(h.name), ca=h.name == ca, scrape_ca=h.name == monitor)),
            hosts=hosts))


# --- the verdict (pure) ------------------------------------------------------------------------------

def parse_sans(text: str) -> frozenset[str]:
    """openssl's subjectAltName text, spaces removed ('IPAddress:198.18.0.11,DNS:x'), as a set of
    'IP:<address>' (normalised: openssl spells IPv6 in full, upper case) and 'DNS:<name>'."""
    out = set()
    for item in filter(None, (text or "").split(",")):
        kind, _, value = item.partition(":")
        if kind == "IPAddress":
            try:
                out.add(f"IP:{ip_address(value)}")
            except ValueError:
                out.add(f"IP:{value}")
        else:
            out.add(f"{kind}:{value}")
    return frozenset(out)


def want_sans(node) -> frozenset[str]:
    """What a node's certificate names: its management address, the one address clients reach it by."""
    return frozenset({f"IP:{ip_address(node.management_address)}"})


def want_usage(node) -> tuple[str, ...]:
    """The extended key usages of a node's certificate from the fleet CA: serverAuth, and nothing else, on
    every node (the router node's too): a node's certificate is no credential to a head, and the exporters'
    copy of it (group prometheus reads it) is none either. The router hop's is its own certificate
    (hop_cert: clientAuth only)."""
    return ("serverAuth",)


def parse_usage(text: str) -> tuple[str, ...]:
    """state_command's `*_eku` line ('TLSWebServerAuthentication,TLSWebClientAuthentication') as openssl's
    config names (serverAuth, clientAuth; an unknown one as printed), sorted."""
    names = {v: k for k, v in USAGE_NAMES.items()}
    return tuple(sorted(names.get(u, u) for u in filter(None, (text or "").split(","))))


def _days(seconds: float) -> int:
    return int(seconds // DAY_S)


def renewal_reasons(found: dict, want: frozenset[str], ca_ski: str | None, bundle_current: bool,
                    renew_before_days: int, usage: tuple[str, ...] = ("serverAuth",), subject: str | None = None,
                    prefix: str = "pem") -> list[str]:
    """Why a certificate from the fleet CA is issued again ([] when it stays), from what the facts pass read
    of it (state_command's `<prefix>_*` lines: `pem` a node's, `hop` the router hop's; `now`): missing, not
    root-only, its key not its own, fewer than `renew_before_days` days left, other SANs than `want`, other
    extended key usages than `usage` (want_usage), another subject than `subject` (None: not read), issued
    by a CA whose key ID is not `ca_ski` (None: the CA's is not known, it is made in this run: every
    certificate is issued again), or not verifying against the node's bundle when that bundle is the
    fleet's (`bundle_current`)."""
    mode = found.get(f"{prefix}_mode", "missing")
    if mode == "missing":
        return ["no certificate yet"]
    reasons = []
    if mode != "root 600":
        reasons.append(f"its file is {mode} (owner, mode), not root 600")
    if found.get(f"{prefix}_match") != "yes":
        reasons.append("its key does not match its certificate")
    try:
        left = int(found[f"{prefix}_end"]) - int(found["now"])
    except (KeyError, ValueError):
        return reasons + ["its certificate cannot be read"]
    if left <= 0:
        reasons.append(f"it expired {_days(-left)} day(s) ago")
    elif left < renew_before_days * DAY_S:
        reasons.append(f"{_days(left)} day(s) left, fewer than tls_renew_before_days = {renew_before_days}")
    sans = parse_sans(found.get(f"{prefix}_sans", ""))
    if sans != want:
        reasons.append(f"it names {', '.join(sorted(sans)) or 'no address'}, not {', '.join(sorted(want)) or 'none'}")
    have = parse_usage(found.get(f"{prefix}_eku", ""))
    if have != tuple(sorted(usage)):
        reasons.append(f"it is for {', '.join(have) or 'no extended key usage'}, not {', '.join(sorted(usage))}")
    if subject is not None and found.get(f"{prefix}_subject", "") != subject:
        reasons.append(f"its subject is {found.get(f'{prefix}_subject') or 'unreadable'}, not {subject}")
    if ca_ski is None:
        reasons.append("the fleet CA is new")
    elif found.get(f"{prefix}_aki", "").upper() != ca_ski.upper():
        reasons.append("another CA issued it")
    elif bundle_current and not found.get(f"{prefix}_verify", "").strip().endswith("OK"):
        reasons.append(f"it does not verify against the fleet CA ({found.get(f'{prefix}_verify', '').strip()[-160:]})")
    return reasons


def kind_reasons(kind: CertKind, found: dict, ca_ski: str | None, bundle_current: bool,
                 renew_before_days: int) -> list[str]:
    """renewal_reasons of one certificate of `kind` (node_cert, hop_cert)."""
    return renewal_reasons(found, kind.sans, ca_ski, bundle_current, renew_before_days, kind.usage, kind.subject,
                           kind.prefix)


def bundle_text(ca_pem: bytes | None, site_cas: tuple[str, ...]) -> bytes:
    """The trust bundle: the fleet CA's certificate (when there is one), then each site's CA file once, in
    order, each ending in one newline."""
    parts = ([ca_pem.decode().strip()] if ca_pem else []) + sorted({pem.strip() for pem in site_cas})
    return "".join(p + "\n" for p in parts).encode()


def _decode(b64: str | None) -> bytes | None:
    if not b64 or b64 == "missing":
        return None
    try:
        return base64.b64decode(b64, validate=True)
    except ValueError:
        return None


def _stamp(epoch: int | None) -> str:
    return "?" if epoch is None else time.strftime("%Y-%m-%d", time.gmtime(epoch))


def _root_only(mode: str) -> bool:
    owner, _, perms = mode.partition(" ")
    try:
        return owner == "root" and int(perms, 8) & 0o077 == 0
    except ValueError:
        return False


def ca_verdict(ca, found: dict) -> tuple[bool, list[str], list[str]]:
    """(the CA is made in this run, refusals, warnings) from the CA node's facts. Made when neither its key
    nor its certificate exists, or only its key (a certificate no client could have pinned); a
    certificate without its key, a key not its own, anything not root-only, or an expired CA is refused:
    clients pinned it, so the deploy never replaces it by itself."""
    key, cert = found.get("ca_key", "missing"), found.get("ca_pem", "missing")
    where = f"{ca.name}: the fleet CA ({ca_key_dir(ca)})"
    move = (f"move {ca_key_dir(ca)} away on {ca.name} (the next deploy makes a new CA; every client must fetch the "
            f"new {ca_bundle_path(ca)} and its fingerprint)")
    if found.get("openssl") == "no":
        return False, [f"{ca.name}: openssl is not installed; the fleet CA is made and used with it "
                       f"(apt-get install openssl), or set tls_ca_node to a node that has it"], []
    if cert == "missing":
        if key != "missing" and not _root_only(key):
            return False, [f"{where}: its key {ca_key_path(ca)} is {key} (owner, mode), not root-only: fix it "
                           f"(chown root, chmod 0600) or {move}"], []
        return True, [], []
    problems, warnings = [], []
    if key == "missing":
        problems.append(f"{where}: its certificate {ca_cert_path(ca)} is there but its key {ca_key_path(ca)} is not: "
                        f"nothing can be issued; restore the key, or {move}")
    elif not _root_only(key) or not _root_only(found.get("ca_dir", "missing")):
        problems.append(f"{where}: its key is {key} in a directory {found.get('ca_dir')} (owner, mode): both must be "
                        f"root-only (chmod 0600 {ca_key_path(ca)}; chmod 0700 {ca_key_dir(ca)})")
    elif found.get("ca_match") != "yes":
        problems.append(f"{where}: its key {ca_key_path(ca)} does not match its certificate {ca_cert_path(ca)}: "
                        f"restore the pair, or {move}")
    try:
        left = int(found["ca_end"]) - int(found["now"])
    except (KeyError, ValueError):
        problems.append(f"{where}: its certificate {ca_cert_path(ca)} cannot be read: {move}")
        return False, problems, warnings
    if left <= 0:
        problems.append(f"{where} expired on {_stamp(int(found['ca_end']))}: no certificate it issues verifies; {move}")
    elif left < ca.tls_renew_before_days * DAY_S:
        warnings.append(f"{where} ends on {_stamp(int(found['ca_end']))} ({_days(left)} day(s) left): the deploy never "
                        f"renews it (clients pinned it); before then, {move}")
    return False, problems, warnings


def site_verdict(node, found: dict) -> tuple[str | None, list[str], list[str]]:
    """(why the node's PEM is built again from the site's files, or None; refusals; warnings). The
    site's certificate is the site's to renew: an expired one, one that does not name the node's
    management address or does not verify against tls_cert_ca_file, and a key that is not root-only or
    not its own are refused."""
    problems, warnings = [], []
    cert, key, ca = found.get("site_cert", "missing"), found.get("site_key", "missing"), found.get("site_ca", "missing")
    for what, k, mode in (("tls_cert_file", "tls_cert_file", cert), ("tls_key_file", "tls_key_file", key),
                          ("tls_cert_ca_file", "tls_cert_ca_file", ca)):
        if mode == "missing":
            problems.append(f"{node.name}: key '{k}' = {getattr(node, k)!r}: no such file on {node.name}")
    if problems:
        return None, problems, warnings
    if not _root_only(key):
        problems.append(f"{node.name}: key 'tls_key_file' = {node.tls_key_file!r} is {key} (owner, mode); it must be "
                        f"root-only (chown root {node.tls_key_file} && chmod 0600 {node.tls_key_file})")
    if found.get("site_match") != "yes":
        problems.append(f"{node.name}: key 'tls_key_file' = {node.tls_key_file!r} is not the key of tls_cert_file "
                        f"{node.tls_cert_file!r} (or one of them is not PEM)")
    sans, want = parse_sans(found.get("site_sans", "")), want_sans(node)
    if not want <= sans:
        problems.append(f"{node.name}: key 'tls_cert_file' = {node.tls_cert_file!r} names "
                        f"{', '.join(sorted(sans)) or 'no address'}; clients reach {node.name} at "
                        f"{node.management_address}: its certificate must name {', '.join(sorted(want))}")
    if not found.get("site_verify", "").strip().endswith("OK"):
        problems.append(f"{node.name}: key 'tls_cert_file' = {node.tls_cert_file!r} does not verify against "
                        f"tls_cert_ca_file {node.tls_cert_ca_file!r} for a TLS server: "
                        f"{found.get('site_verify', '').strip()[-200:]}")
    try:
        left = int(found["site_end"]) - int(found["now"])
    except (KeyError, ValueError):
        left = None
    if left is not None and left <= 0:
        problems.append(f"{node.name}: key 'tls_cert_file' = {node.tls_cert_file!r} expired on "
                        f"{_stamp(int(found['site_end']))}; the site renews it (the deploy never does)")
    elif left is not None and left < node.tls_renew_before_days * DAY_S:
        warnings.append(f"{node.name}: tls_cert_file {node.tls_cert_file} ends on {_stamp(int(found['site_end']))} "
                        f"({_days(left)} day(s) left): renew it (the deploy never does), then deploy")
    why = None
    if found.get("pem_current") != "yes":
        why = "no proxy PEM yet" if found.get("pem_mode", "missing") == "missing" else "the site's files changed"
    elif found.get("pem_mode") != "root 600":
        why = f"the proxy PEM is {found.get('pem_mode')} (owner, mode), not root 600"
    return why, problems, warnings


def decide(fleet, facts: dict[str, dict]) -> TlsPlan:
    """The run's TLS, a pure function of the facts pass (`facts`: node name -> its TlsState, for the nodes
    of scope() in this run) and the validated fleet."""
    first = fleet.nodes[0]
    if not first.tls_enabled:
        return TlsPlan(enabled=False, disabled_reason=first.tls_disabled_reason or "",
                       warnings=(f"TLS is off (tls_enabled = False: {first.tls_disabled_reason}): the API, and the "
                                 f"key in every request, cross the LAN in plain HTTP",))
    problems, warnings = [], []
    for name, found in sorted(facts.items()):
        if found.get("openssl") == "no":
            problems.append(f"{name}: openssl is not installed (Debian/Ubuntu: apt-get install openssl); roles/tls "
                            f"checks and issues certificates with it")
    if problems:
        return TlsPlan(enabled=True, ca_node=ca_node_name(fleet.nodes), problems=tuple(problems))
    ca_name = ca_node_name(fleet.nodes)
    ca = fleet.node(ca_name) if ca_name else None
    create_ca, ca_pem, ca_ski, ca_fp, ca_end = False, None, None, "", None
    if ca is not None and ca_name in facts:
        found = facts[ca_name]
        create_ca, refused, warned = ca_verdict(ca, found)
        problems += refused
        warnings += warned
        if not create_ca and not refused:
            ca_pem, ca_ski, ca_fp = _decode(found.get("ca_pem")), found.get("ca_ski") or None, found.get("ca_fp", "")
            ca_end = int(found["ca_end"])
    outside = ca is not None and ca_name not in facts  # the CA node is not in this run (--limit)

    issue, assemble, days_left, site_cas, hop, hop_days_left = {}, {}, {}, [], {}, {}
    issued = []  # (node, kind, where its verdict goes, where its days left go): each certificate from the fleet CA
    for node in certified(fleet):
        found = facts.get(node.name)
        if found is None:
            continue  # not in this run
        if site_certs(node):
            why, refused, warned = site_verdict(node, found)
            problems += refused
            warnings += warned
            if found.get("site_ca_pem"):
                site_cas.append(_decode(found["site_ca_pem"]).decode(errors="replace"))
            if why and not refused:
                assemble[node.name] = why
        else:
            issued.append((node, node_cert(node), issue, days_left))
    for node in fleet.nodes:
        if node.name in facts and (kind := hop_cert(node)) is not None:
            issued.append((node, kind, hop, hop_days_left))
    for node, kind, verdicts, days in issued:
        found = facts[node.name]
        if outside:
            reasons = kind_reasons(kind, found, found.get(f"{kind.prefix}_aki"), True, node.tls_renew_before_days)
            if reasons:
                problems.append(f"{node.name}: its {kind.what} is due ({'; '.join(reasons)}) and the fleet CA is "
                                f"on {ca_name}, which this run leaves out (--limit): run with {ca_name} too")
            continue
        if f"{kind.prefix}_end" in found and "now" in found:
            days[node.name] = _days(int(found[f"{kind.prefix}_end"]) - int(found["now"]))
        want_bundle = bundle_text(ca_pem, ()) if ca_pem else None
        current = want_bundle is not None and found.get("bundle_sha") == hashlib.sha256(want_bundle).hexdigest()
        reasons = kind_reasons(kind, found, None if create_ca else ca_ski, current, node.tls_renew_before_days)
        if reasons:
            verdicts[node.name] = tuple(reasons)

    exporter_pem = {}
    for node in certified(fleet):
        found = facts.get(node.name)
        if found is not None and exporter_tls(node):
            why = exporter_pem_reason(found, node.name in issue or node.name in assemble)
            if why:
                exporter_pem[node.name] = why

    bundle = {}
    monitor = monitoring_node_name(list(fleet.nodes))
    if not outside:
        want = bundle_text(ca_pem, tuple(site_cas)) if (ca is None or ca_pem) else None
        digest = hashlib.sha256(want).hexdigest() if want is not None else None
        for name, found in sorted(facts.items()):
            if digest is None:
                bundle[name] = "the fleet CA is new"
            elif found.get("bundle_sha") != digest:
                bundle[name] = "no trust bundle yet" if found.get("bundle_sha") == "missing" else "the trust bundle changed"
            elif name == monitor and fleet.node(name).monitoring_enabled and found.get("scrape_ca_sha") != digest:
                bundle[name] = "Prometheus' copy of the trust bundle differs"
    return TlsPlan(enabled=True, ca_node=ca_name, create_ca=create_ca, ca_fingerprint=ca_fp, ca_not_after=ca_end,
                   issue=issue, assemble=assemble, exporter_pem=exporter_pem, bundle=bundle, hop=hop,
                   site_cas=tuple(sorted(set(site_cas))),
                   days_left=days_left, hop_days_left=hop_days_left, problems=tuple(problems), warnings=tuple(warnings))


EXPORTER_PEM_MODE = f"root:{EXPORTER_GROUP} 640"


def exporter_pem_reason(found: dict, renewed: bool) -> str | None:
    """Why the exporters' copy of the node's PEM (EXPORTER_PEM) is written again, or None, from the facts
    pass (`exporter_pem`: current, differs or missing; its owner:group and mode) and whether this run gives
    the node a new certificate (`renewed`: issued, or a site's assembled)."""
    if renewed:
        return "the node's certificate is new in this run"
    state = found.get("exporter_pem", "missing")
    if state == "missing":
        return "no copy yet"
    if state != "current":
        return "it is not the node's certificate"
    if found.get("exporter_pem_mode") != EXPORTER_PEM_MODE:
        return f"it is {found.get('exporter_pem_mode')} (owner:group mode), not {EXPORTER_PEM_MODE}"
    return None


def refusal(plan: TlsPlan | None) -> DeployError | None:
    return DeployError("\n".join(plan.problems)) if plan is not None and plan.problems else None


def fetch_hint(fleet, plan: TlsPlan) -> str:
    """How a client gets the bundle: from a head, over SSH."""
    head = next((n for n in fleet.nodes if n.is_head), None)
    if head is None:
        return ""
    return f"ssh root@{head.management_address} cat {ca_bundle_path(head)} > sparkfleet-ca.crt"


def plan_lines(fleet, plan: TlsPlan) -> list[str]:
    """The plan's TLS lines (printed under the fleet's lines, read back by tests/e2e/plan_conformance.py):
    '--> sparkfleet TLS: ...', then what this run creates, issues, builds and writes."""
    if not plan.enabled:
        return [f"--> sparkfleet TLS: off ({plan.disabled_reason}): the API speaks plain HTTP"]
    if plan.ca_node and plan.create_ca:
        head = f"the fleet CA is created on {plan.ca_node} in this run (its SHA-256 fingerprint is printed then)"
    elif plan.ca_node and plan.ca_fingerprint:
        head = (f"the fleet CA on {plan.ca_node}, SHA-256 {plan.ca_fingerprint}, valid until "
                f"{_stamp(plan.ca_not_after)}")
    elif plan.ca_node:
        head = f"the fleet CA on {plan.ca_node} (not in this run)"
    else:
        head = "the sites' own certificates (no fleet CA)"
    out = [f"--> sparkfleet TLS: {head}; clients verify with it: {fetch_hint(fleet, plan)}"]
    if plan.create_ca:
        out.append(f"    fleet CA created on: {plan.ca_node}")
    for name, reasons in sorted(plan.issue.items()):
        out.append(f"    certificate issued for {name}: {'; '.join(reasons)}")
    for name, reasons in sorted(plan.hop.items()):
        out.append(f"    router hop's client certificate issued on {name}: {'; '.join(reasons)}")
    for name, why in sorted(plan.assemble.items()):
        out.append(f"    site certificate installed on {name}: {why}")
    for name, why in sorted(plan.exporter_pem.items()):
        out.append(f"    exporters' copy of the certificate written on {name}: {why}")
    if plan.bundle:
        out.append(f"    trust bundle written on: {', '.join(sorted(plan.bundle))}")
    for name, days in sorted(plan.days_left.items()):
        if name not in plan.issue:
            out.append(f"    {name}: its certificate has {days} day(s) left")
    for name, days in sorted(plan.hop_days_left.items()):
        if name not in plan.hop:
            out.append(f"    {name}: the router hop's client certificate has {days} day(s) left")
    return out + [f"    warning: {w}" for w in plan.warnings]


# --- commands (run on the nodes) ---------------------------------------------------------------------

def _genkey(path: str) -> str:
    return f"openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:{CURVE} -out {shlex.quote(path)}"


def create_ca_command(ca, days: int, subject: str) -> str:
    """Shell, on the CA node: the CA's key (root-only from its first byte: umask 077, made beside and
    renamed) unless it exists, then its self-signed certificate unless it exists; nothing when both are
    there. A config of its own: the node's openssl.cnf adds nothing."""
    d, key, cert = ca_key_dir(ca), ca_key_path(ca), ca_cert_path(ca)
    qd, qk, qc = shlex.quote(d), shlex.quote(key), shlex.quote(cert)
    config = ("[req]\\ndistinguished_name = dn\\nprompt = no\\nx509_extensions = ca\\n"
              f"[dn]\\nO = sparkfleet\\nCN = {subject}\\n"
              "[ca]\\nbasicConstraints = critical,CA:TRUE,pathlen:0\\nkeyUsage = critical,keyCertSign,cRLSign\\n"
              "subjectKeyIdentifier = hash\\n")
    return (f"set -e; umask 077; install -d -m 0700 {shlex.quote(tls_dir(ca))} {qd}; "
            f"if [ ! -e {qk} ]; then rm -f {qk}.new; {_genkey(key + '.new')}; mv -fT {qk}.new {qk}; fi; "
            f"if [ ! -e {qc} ]; then t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; printf '%b' {shlex.quote(config)} > \"$t/ca.cnf\"; "
            f"openssl req -x509 -new -key {qk} -config \"$t/ca.cnf\" -days {int(days)} -sha256 -out {qc}.new; "
            f"chmod 0644 {qc}.new; mv -fT {qc}.new {qc}; fi; "
            f"openssl x509 -in {qc} -noout -fingerprint -sha256 | cut -d= -f2")


def csr_command(node, kind: CertKind | None = None) -> str:
    """Shell, on the node: a new key beside the PEM of `kind` (default: the node's certificate), root-only
    from its first byte, and its CSR on stdout (public). The key stays on the node."""
    kind = kind or node_cert(node)
    new = f"{kind.pem}.key.new"
    config = "[req]\\ndistinguished_name = dn\\nprompt = no\\n[dn]\\nCN = sparkfleet\\n"
    return (f"set -e; umask 077; install -d -m 0700 {shlex.quote(tls_dir(node))}; "
            f"rm -f {shlex.quote(new)}; {_genkey(new)}; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; "
            f"printf '%b' {shlex.quote(config)} > \"$t/req.cnf\"; openssl req -new -key {shlex.quote(new)} -config \"$t/req.cnf\"")


def sign_command(ca, node, days: int, kind: CertKind | None = None) -> str:
    """Shell, on the CA node: the CSR on stdin signed as `kind` of `node` (default: the node's certificate;
    its subject and extensions set here, none taken from the CSR): its subject (O=sparkfleet, CN the
    node's name, or HOP_CN for the router hop's), its extended key usages (serverAuth for a node's,
    clientAuth for the hop's: never both), its IP SANs (the node's management address; none for the
    hop's), a random 128-bit serial; the certificate on stdout (public)."""
    kind = kind or node_cert(node)
    config = ("basicConstraints = critical,CA:FALSE\\nkeyUsage = critical,digitalSignature\\n"
              f"extendedKeyUsage = {', '.join(kind.usage)}\\nsubjectKeyIdentifier = hash\\n"
              "authorityKeyIdentifier = keyid:always\\n"
              + (f"subjectAltName = {', '.join(sorted(kind.sans))}\\n" if kind.sans else ""))
    return (f"set -e; t=$(mktemp -d); trap 'rm -rf \"$t\"' EXIT; printf '%b' {shlex.quote(config)} > \"$t/ext.cnf\"; "
            f"cat > \"$t/req.csr\"; openssl req -in \"$t/req.csr\" -noout -verify 2>/dev/null; "
            f"openssl x509 -req -in \"$t/req.csr\" -CA {shlex.quote(ca_cert_path(ca))} "
            f"-CAkey {shlex.quote(ca_key_path(ca))} -set_serial 0x$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n') "
            f"-days {int(days)} -sha256 -subj '/O={ORGANIZATION}/CN={kind.cn}' -extfile \"$t/ext.cnf\" 2>/dev/null")


def install_command(node, kind: CertKind | None = None) -> str:
    """Shell, on the node: the certificate on stdin, then the new key, into the PEM of `kind` (default: the
    node's certificate; 0600, one rename: no reader ever finds a certificate without its key), once openssl
    agrees the key is its own."""
    kind = kind or node_cert(node)
    pem, new = shlex.quote(kind.pem), shlex.quote(f"{kind.pem}.key.new")
    return (f"set -e; umask 077; cat > {pem}.crt.new; "
            f"[ \"$(openssl x509 -in {pem}.crt.new -noout -pubkey)\" = \"$(openssl pkey -in {new} -pubout)\" ] || "
            f"{{ echo 'the signed certificate is not for the new key' >&2; rm -f {pem}.crt.new {new}; exit 3; }}; "
            f"cat {pem}.crt.new {new} > {pem}.new; rm -f {pem}.crt.new {new}; "
            f"chmod 0600 {pem}.new; mv -fT {pem}.new {pem}")


def assemble_command(node) -> str:
    """Shell, on a node with the site's certificate: its certificate file, then its key file, into the
    node's PEM (0600, one rename)."""
    pem = shlex.quote(proxy_pem_path(node))
    return (f"set -e; umask 077; install -d -m 0700 {shlex.quote(tls_dir(node))}; "
            f"cat {shlex.quote(node.tls_cert_file)} {shlex.quote(node.tls_key_file)} > {pem}.new; "
            f"chmod 0600 {pem}.new; mv -fT {pem}.new {pem}")


def exporter_tls_dir_command() -> str:
    """Shell: EXPORTER_TLS_DIR, root:prometheus 0750 (its parent /etc/prometheus root's, 0755, when absent).
    The group exists before the firewall (roles/monitoring/user_tasks.py, step 3a)."""
    d, g = shlex.quote(EXPORTER_TLS_DIR), shlex.quote(EXPORTER_GROUP)
    return (f"install -d -m 0755 -o root -g root {shlex.quote(EXPORTER_TLS_DIR.rsplit('/', 1)[0])}; "
            f"install -d -m 0750 -o root -g {g} {d}")


def exporter_pem_command(node) -> str:
    """Shell, on a node whose exporters speak TLS: its PEM (certificate, then key) copied into EXPORTER_PEM,
    root:prometheus 0640 before it is renamed into place, in the directory only root writes: the node
    exporter (user prometheus) reads it and nothing else it could do reaches root's copy. The key never
    leaves the node."""
    pem, e = shlex.quote(proxy_pem_path(node)), shlex.quote(EXPORTER_PEM)
    return (f"set -e; umask 077; {exporter_tls_dir_command()}; rm -f {e}.new; cp {pem} {e}.new; "
            f"chown root:{shlex.quote(EXPORTER_GROUP)} {e}.new; chmod 0640 {e}.new; mv -fT {e}.new {e}")


def ca_subject(ca) -> str:
    """The CA's name: its node, its day and 6 random hex digits, so that two fleets' CAs (or a CA made again)
    are told apart by name as well as by fingerprint."""
    return f"sparkfleet fleet CA ({ca.name}, {time.strftime('%Y-%m-%d', time.gmtime())}, {secrets.token_hex(3)})"


# --- operation bodies --------------------------------------------------------------------------------

def _run(host, command: str, stdin: str | None = None, what: str = "") -> str:
    extra = {"_stdin": stdin} if stdin is not None else {}
    ok, out = host.run_shell_command(StringCommand(command), **extra, **connector_arguments(host))
    if not ok:
        error = "\n".join(out.stderr_lines).strip()[-400:]
        raise DeployError(f"{host.name}: TLS: {what} failed: {error or 'no error given'}")
    return out.stdout


def create_ca(days: int) -> None:
    """Operation body (the CA node): the fleet CA, whatever of it is missing; prints its fingerprint and where
    clients get it."""
    from pyinfra import host, state

    from sparkfleet.inventory import fleet_from_state

    fleet = fleet_from_state(state)
    ca = fleet.node(host.name)
    fingerprint = _run(host, create_ca_command(ca, days, ca_subject(ca)), what="making the fleet CA").strip()
    logger.info(f"--> sparkfleet TLS: the fleet CA on {ca.name}, SHA-256 {fingerprint}: clients verify the API with "
                f"it ({ca_bundle_path(ca)} on every certified node)")


def issue_certificate(ca_name: str, days: int, hop: bool = False) -> None:
    """Operation body (a node the plan names): a new key and CSR on the node, signed by the fleet CA on its
    node over that node's own connection (only the CSR and the certificate cross, both public), the
    certificate and key into its PEM: the node's certificate, or with `hop` (the router node) the router
    hop's client certificate."""
    from pyinfra import host, state

    from sparkfleet.inventory import fleet_from_state

    fleet = fleet_from_state(state)
    node, ca = fleet.node(host.name), fleet.node(ca_name)
    kind = hop_cert(node) if hop else node_cert(node)
    csr = _run(host, csr_command(node, kind), what=f"making a key and its CSR ({kind.what})")
    cert = _run(state.inventory.get_host(ca_name), sign_command(ca, node, days, kind), stdin=csr,
                what=f"signing {node.name}'s {kind.what} on {ca_name}")
    _run(host, install_command(node, kind), stdin=cert, what=f"installing the {kind.what}")
    names = ", ".join(sorted(kind.sans)) or "no address"
    logger.info(f"    [{host.name}] a new {kind.what} ({kind.subject}; {names}; {', '.join(kind.usage)}), "
                f"from the fleet CA on {ca_name}, valid {days} days")


def write_bundle(ca_name: str | None, site_cas: tuple[str, ...], scrape_ca: bool = False) -> None:
    """Operation body (a node the plan names): the trust bundle, the fleet CA's certificate as its node has it
    now (it may have been made in this run) and the sites' CA certificates, into <tls>/ca.crt (0644, in
    the 0700 <tls>); `scrape_ca` (the monitoring node): into SCRAPE_CA too, for Prometheus."""
    from pyinfra import host, state

    from sparkfleet.inventory import fleet_from_state
    from sparkfleet.keyfiles import read

    fleet = fleet_from_state(state)
    node = fleet.node(host.name)
    ca_pem = None
    if ca_name is not None:
        ca_pem = read(state.inventory.get_host(ca_name), ca_cert_path(fleet.node(ca_name)))
        if ca_pem is None:
            raise DeployError(f"{ca_name}: TLS: the fleet CA's certificate {ca_cert_path(fleet.node(ca_name))} is missing")
    _run(host, f"umask 077; install -d -m 0700 {shlex.quote(tls_dir(node))}", what="making the TLS directory")
    write_file(host, ca_bundle_path(node), bundle_text(ca_pem, site_cas), "root", "0644")
    if scrape_ca:
        _run(host, exporter_tls_dir_command(), what=f"making {EXPORTER_TLS_DIR}")
        write_file(host, SCRAPE_CA, bundle_text(ca_pem, site_cas), "root", "0644")


# --- what a head serves (make status) -------------------------------------------------------------------

class ServedTls(FactBase):
    """What the head's API proxy serves now, asked on the head as a client would: /health through TLS
    verified with the node's bundle (its HTTP code, 000 when the certificate does not verify), the bundle's
    SHA-256 fingerprint (its first certificate: the fleet CA's), and the served certificate's end."""

    def command(self, api: str, bundle: str, port: int) -> str:
        b = shlex.quote(bundle)
        return (f"echo code=$(curl -sS -m 5 -o /dev/null -w '%{{http_code}}' --cacert {b} {api}/health 2>/dev/null); "
                f"echo bundle_fp=$(openssl x509 -in {b} -noout -fingerprint -sha256 2>/dev/null | cut -d= -f2); "
                f"e=$(openssl s_client -connect 127.0.0.1:{int(port)} </dev/null 2>/dev/null | "
                f"openssl x509 -noout -enddate 2>/dev/null | cut -d= -f2); "
                f"echo end=$([ -n \"$e\" ] && date -d \"$e\" +%s); echo now=$(date +%s)")

    def process(self, output):
        return key_values(output)


def status_line(head, api: str, found: dict | None) -> str:
    """`make status`'s TLS row for a head (pure): whether its API verifies, with what, and for how long."""
    if not head.tls_enabled:
        return f"off (tls_enabled = False: {head.tls_disabled_reason}): {api} is plain HTTP"
    found = found or {}
    bundle = ca_bundle_path(head)
    try:
        days = f", the certificate valid {_days(int(found['end']) - int(found['now']))} more day(s)"
    except (KeyError, ValueError):
        days = ""
    fp = f" (first certificate SHA-256 {found['bundle_fp']})" if found.get("bundle_fp") else ""
    if found.get("code") == "200":
        return f"{api}: /health 200, its certificate verified with {bundle}{fp}{days}"
    return (f"{api}: NOT verified with {bundle}{fp}: /health answered {found.get('code') or 'nothing'} through "
            f"TLS{days} (deploy; make doctor)")


def doctor_problems(head, found: dict | None) -> list[str]:
    """The doctor's tls row of a head (pure): its API must answer /health through TLS verified with the
    node's bundle, and its certificate must have more than tls_renew_before_days left (a deploy renews a
    fleet CA's one; a site's is the site's)."""
    if not head.tls_enabled:
        return []
    found = found or {}
    if found.get("code") != "200":
        return [f"{head.name}: /health through TLS, verified with {ca_bundle_path(head)}, answered "
                f"{found.get('code') or 'nothing'}: the API's certificate is not the fleet's (deploy)"]
    try:
        left = int(found["end"]) - int(found["now"])
    except (KeyError, ValueError):
        return [f"{head.name}: the certificate the API serves could not be read"]
    if left < head.tls_renew_before_days * DAY_S:
        who = "renew tls_cert_file, then deploy" if site_certs(head) else "deploy: it issues a new one"
        return [f"{head.name}: the API's certificate ends in {_days(left)} day(s), within tls_renew_before_days = "
                f"{head.tls_renew_before_days}: {who}"]
    return []
