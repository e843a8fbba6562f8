"""Each node's management address, decided once on the controller: addresses, not names, where trust
is decided.

The management address is rendered into everything that decides who is trusted or where a secret
goes: the router's backends (roles/router: the fleet key and live prompts go there), the Prometheus
scrape targets and the exporters' listen addresses (roles/monitoring), the firewall's monitoring
allowance (sparkfleet/firewall_rules.py), the deploy's /health probes. A name there would be
resolved again on a node, at any time, by whoever answers; so every one of them is an IP literal:

- given: the inventory's ssh_hostname is an IP literal (the lab's, and what docs/configuration.md
  asks for);
- resolved on the controller: ssh_hostname (else the inventory name) is a name; it is resolved once
  per process (socket.getaddrinfo, IPv4), before any connection, and must give exactly one address:
  none, or several (which machine is meant is then not decided), is refused naming the host, the key
  and what it resolved to. The plan prints every node's line (`spark-a: name -> address (resolved on
  the controller)`), and nothing on a node resolves it;
- an mDNS name (`*.local`) is refused by default: any host on the LAN answers mDNS (no server owns
  the `.local` zone, RFC 6762), so the answer is an attacker's choice as much as the network's. The
  data key `management_resolve_mdns_once` accepts the controller's one answer (pinned for the run and
  printed in the plan, as any resolved name) for a site that cannot give addresses; it requires
  ssh_strict_host_key_checking = 'yes', since pyinfra's SSH connection resolves the name again (pyinfra
  connectors/ssh.py make_paramiko_kwargs: hostname = ssh_hostname) and its default 'accept-new'
  (connectors/ssh.py connector_data_meta) would trust a spoofer's host key on a first connection.
  Refusal by default rather than resolution: a deploy that pins a spoofed answer hands it the fleet key
  without a word, and the operator who reads the plan line cannot tell a spoofed address from a real one.

Not covered here: the SSH connection itself (pyinfra resolves ssh_hostname on each connect; the host key
is its check), and ARP spoofing of an address (a network-layer attack a name cannot fix either).
"""
from __future__ import annotations

import socket
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any, Mapping

from sparkfleet.refusal import Problem

MDNS_KEY = "management_resolve_mdns_once"
KEY = "ssh_hostname"
# pyinfra's local connector (`@local`): the node is the controller itself.
LOCAL_CONNECTOR = "@local"
LOOPBACK = "127.0.0.1"
GIVEN = "given"
RESOLVED = "resolved on the controller"
CONNECTOR = "the controller itself (pyinfra's @local)"

# name -> the IPv4 addresses it resolved to, asked once per process: the validation before any
# connection, the deploy's steps and the plan all read the same answer (sparkfleet.run validates,
# sparkfleet.inventory.fleet_from_state builds the cluster again from the same data).
_RESOLVED: dict[str, tuple[str, ...]] = {}


def ipv4_addresses(name: str) -> tuple[str, ...]:
    """The distinct IPv4 addresses the controller's resolver gives for `name`, in its order; () when it
    gives none (unknown name, no IPv4 address, no resolver)."""
    try:
        infos = socket.getaddrinfo(name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # socket.gaierror is an OSError
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve_once(name: str) -> tuple[str, ...]:
    """`ipv4_addresses(name)`, asked of the resolver once per process and pinned."""
    if name not in _RESOLVED:
        _RESOLVED[name] = ipv4_addresses(name)
    return _RESOLVED[name]


def is_ip_literal(text: str) -> bool:
    try:
        ip_address(text)
    except ValueError:
        return False
    return True


def is_mdns(name: str) -> bool:
    """An mDNS name: `.local` is the link-local multicast DNS domain (RFC 6762 section 3)."""
    return name.rstrip(".").lower().endswith(".local")


@dataclass(frozen=True)
class Pinned:
    """A node's management address and how it was decided: `given` is what the inventory gave
    (ssh_hostname, else the inventory name); `how` is GIVEN, RESOLVED or CONNECTOR."""
    node: str
    given: str
    address: str
    how: str

    def line(self) -> str:
        """The plan's line: 'spark-a: spark-a.lan -> 192.168.1.11 (resolved on the controller)'."""
        if self.how == GIVEN:
            return f"{self.node}: {self.address} ({self.how})"
        return f"{self.node}: {self.given} -> {self.address} ({self.how})"


def pin(name: str, data: Mapping[str, Any], accept_mdns: bool, node_names: set[str]) -> Pinned | Problem:
    """Node `name`'s management address from its merged data, or the problem that refuses it."""
    hostname = data.get(KEY)
    given = str(hostname) if hostname else name
    what = f"key '{KEY}' = {given!r}" if hostname else f"key '{KEY}' not set: the inventory name {given!r}"
    if not hostname and name == LOCAL_CONNECTOR:
        return Pinned(name, given, LOOPBACK, CONNECTOR)
    if is_ip_literal(given):
        return Pinned(name, given, str(ip_address(given)), GIVEN)
    if hostname and given in node_names and given != name:
        return Problem(f"key '{KEY}' = {given!r} is the name of node {given}; a node's management address must not "
                       f"be another node's name", [name], key=KEY)
    if given.startswith("@"):
        return Problem(f"{what} is a pyinfra connector name, not a machine on the management network; the router, "
                       f"the scrape targets and the firewall need its address", [name], key=KEY,
                       fix="set ssh_hostname to the node's management IPv4 address")
    uses = ("it is what the router's backends, the scrape targets and the firewall name, so it is resolved once, "
            "here, and never on a node")
    if is_mdns(given) and not accept_mdns:
        return Problem(
            f"{what} is an mDNS name: any host on the LAN can answer for it, and the router's backends, the scrape "
            f"targets and the firewall would trust the address it gave (one spoofed answer would receive the fleet "
            f"key and live prompts)", [name], key=KEY,
            fix=f"give the node's management IPv4 address as ssh_hostname, or set {MDNS_KEY} = True for this node to "
                f"accept the controller's one answer, pinned for the run and printed in the plan (with "
                f"ssh_strict_host_key_checking = 'yes')")
    if is_mdns(given) and str(data.get("ssh_strict_host_key_checking") or "accept-new") != "yes":
        found = data.get("ssh_strict_host_key_checking") or "not set: pyinfra's default 'accept-new'"
        return Problem(
            f"key '{MDNS_KEY}' = True for the mDNS name {given!r} with ssh_strict_host_key_checking {found!r}: the "
            f"SSH session resolves the name again, and only a known host key tells the node from a spoofer (allowed: "
            f"'yes')", [name], key=MDNS_KEY,
            fix="set ssh_strict_host_key_checking = 'yes' (with the node's key in ssh_known_hosts_file), or give the "
                "address as ssh_hostname")
    addresses = resolve_once(given)
    if len(addresses) != 1:
        found = ", ".join(addresses) if addresses else "no IPv4 address"
        why = ("which machine it names is not decided" if addresses else "the controller cannot resolve it")
        return Problem(f"{what} resolves on the controller to {found}: allowed one IPv4 address ({why}); {uses}",
                       [name], key=KEY,
                       fix="give the node's management IPv4 address as ssh_hostname")
    return Pinned(name, given, addresses[0], RESOLVED)


def plan_lines(nodes) -> list[str]:
    """The plan's lines: every node's management address and how it was decided (the nodes of a
    validated cluster: NodeConfig's management_given, management_address and management_how)."""
    return [Pinned(n.name, n.management_given, n.management_address, n.management_how).line() for n in nodes]
