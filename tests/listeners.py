"""The listener table of docs/security.md against a node's `ss -ltnup` (issue 43 item 10).

The table's first rows say, per listening socket of a deployed node, in a fixed form:
  - `on`: the roles of node it is on (`every node`, `head`, `worker`, `router node`, `monitoring
    node`, `GPU node`), then, after `;`, when: ``when `key` `` (a boolean data key that must be true),
    `only while a proof runs` (never required: a due fabric speed proof's servers), `where present`
    (not sparkfleet's and not on every OS: never required);
  - `bind`: `all addresses`, `the fabric address` (the first half's), `each half's fabric address`,
    `the management address`, or addresses written out (`127.0.0.1`, `127.0.0.53 and 127.0.0.54`);
  - `port`: `<port>/<proto>` or `ephemeral/<proto>`, several separated by commas, before any `(`; the
    first data key in backticks after it is the port's key (`8000/tcp (`port` of the profile)`), whose
    value in data replaces the default (a second port keeps its offset from the first);
  - `process`: the names `ss -p` shows, each in backticks.
compare() returns every socket no row explains and every required fixed port with no socket. A row
with ephemeral ports explains a socket of its process on its bind at a port of EPHEMERAL that no
fixed-port row of that node names: the engine's own sockets cannot hide one on the API's, the
engine's or the rendezvous' port, nor on any port below the range.
"""
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path
import re

from sparkfleet.listeners import Socket, parse_ss

REPO = Path(__file__).resolve().parent.parent
SECURITY_DOC = REPO / "docs" / "security.md"
ROLES = ("every node", "head", "worker", "router node", "monitoring node", "GPU node")
COLUMNS = ("service", "on", "bind", "port", "process")
ALL_ADDRESSES = {"0.0.0.0", "::", "*"}
# `ephemeral` in the table: a port the kernel picks (a bind to port 0) comes from
# net.ipv4.ip_local_port_range, 32768-60999 by default (the kernel's Documentation/networking/
# ip-sysctl.rst), and a program that picks its own takes it from the dynamic ports above (IANA's
# 49152-65535). A port below 32768 is never ephemeral here: it needs a row of its own.
EPHEMERAL = range(32768, 65536)
_PORT = re.compile(r"\b(\d+|ephemeral)/(tcp|udp)\b")
_KEY = re.compile(r"`([a-z][a-z0-9_]*)`")


@dataclass(frozen=True)
class Row:
    service: str
    roles: frozenset[str]
    binds: tuple[str, ...]  # `all addresses`, `fabric`, `fabric halves`, `management`, or an address
    ports: tuple[tuple[int | None, str], ...]  # (port or None: ephemeral, proto)
    processes: frozenset[str]
    key: str | None = None  # the data key of the first port
    when: tuple[str, ...] = ()  # boolean data keys that must be true
    proof_only: bool = False  # only while a fabric speed proof runs: never required
    where_present: bool = False  # not on every OS: never required

    @property
    def required(self) -> bool:
        return not (self.proof_only or self.where_present)


@dataclass(frozen=True)
class HostContext:
    """What the table needs of one node: its roles, its data's true flags, its addresses, its ports."""
    name: str
    roles: frozenset[str]
    flags: frozenset[str]  # boolean data keys that are true on this node
    addresses: dict = field(default_factory=dict)  # management, fabric, fabric halves (a tuple)
    ports: dict = field(default_factory=dict)  # data key -> this node's value


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_on(cell: str) -> tuple[frozenset[str], tuple[str, ...], bool, bool]:
    """(roles, when-keys, proof_only, where_present) of an `on` cell; ValueError on a word outside the form."""
    parts = [p.strip() for p in cell.split(";")]
    roles = frozenset(r.strip() for r in parts[0].split(","))
    unknown = roles - set(ROLES)
    if unknown:
        raise ValueError(f"listener table: unknown role(s) {sorted(unknown)} in {cell!r}; allowed: {', '.join(ROLES)}")
    when, proof_only, where_present = [], False, False
    for part in parts[1:]:
        if part.startswith("when "):
            when += _KEY.findall(part)
        elif part.startswith("only while a proof runs"):
            proof_only = True
        elif part.startswith("where present"):
            where_present = True
        else:
            raise ValueError(f"listener table: {part!r} in {cell!r} is none of `when `key``, `only while a proof "
                             f"runs`, `where present`")
    return roles, tuple(when), proof_only, where_present


BIND_WORDS = {"all addresses": "all addresses", "the fabric address": "fabric",
              "each half's fabric address": "fabric halves", "the management address": "management"}


def parse_bind(cell: str) -> tuple[str, ...]:
    """The binds of a `bind` cell (text before any `(`): BIND_WORDS or addresses, joined by `,`, `and`, `or`."""
    text = cell.split("(", 1)[0].strip()
    binds = []
    for part in (p.strip() for p in re.split(r",|\s+and\s+|\s+or\s+", text)):
        if part in BIND_WORDS:
            binds.append(BIND_WORDS[part])
        elif part:
            try:
                binds.append(str(ip_address(part)))
            except ValueError:
                raise ValueError(f"listener table: bind {part!r} in {cell!r} is neither an address nor one of "
                                 f"{', '.join(BIND_WORDS)}") from None
    if not binds:
        raise ValueError(f"listener table: empty bind in {cell!r}")
    return tuple(binds)


def parse_port(cell: str) -> tuple[tuple[tuple[int | None, str], ...], str | None]:
    head, _, rest = cell.partition("(")
    ports = tuple((None if p == "ephemeral" else int(p), proto) for p, proto in _PORT.findall(head))
    if not ports:
        raise ValueError(f"listener table: no `<port>/<proto>` or `ephemeral/<proto>` in {cell!r}")
    key = _KEY.findall(rest)
    return ports, (key[0] if key and ports[0][0] is not None else None)


def table_rows(text: str | None = None) -> list[Row]:
    """The rows of the first table of docs/security.md (or of `text`)."""
    lines = (SECURITY_DOC.read_text() if text is None else text).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| service |"))
    header = _cells(lines[start])
    if tuple(header[:len(COLUMNS)]) != COLUMNS:
        raise ValueError(f"listener table: its columns start {header[:len(COLUMNS)]}, want {list(COLUMNS)}")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        service, on, bind, port, process = _cells(line)[:len(COLUMNS)]
        roles, when, proof_only, where_present = parse_on(on)
        ports, key = parse_port(port)
        processes = frozenset(re.findall(r"`([^`]+)`", process))
        if not processes:
            raise ValueError(f"listener table: no process in backticks in {service!r}'s row")
        rows.append(Row(service, roles, parse_bind(bind), ports, processes, key, when, proof_only, where_present))
    return rows


def host_context(cluster, name: str) -> HostContext:
    """The node `name` of a validated fleet (sparkfleet.inventory.load_cluster) as the table sees it."""
    from sparkfleet.model.monitoring import monitoring_node_name
    from sparkfleet.model.serving import node_profile

    node = cluster.node(name)
    roles = {"every node", "head" if node.is_head else "worker"}
    if node.router_node == name:
        roles.add("router node")
    if monitoring_node_name(list(cluster.nodes)) == name:
        roles.add("monitoring node")
    if node.gpu_expected:
        roles.add("GPU node")
    flags = {k for k, v in node.model_dump().items() if v is True}
    profile = node_profile(cluster.group_of(name).head)
    ports = {k: v for k, v in node.model_dump().items() if k.endswith("_port") and isinstance(v, int)}
    ports.update(port=profile.port, master_port=profile.master_port)
    return HostContext(name, frozenset(roles), frozenset(flags),
                       {"management": node.management_address, "fabric": node.fabric_ip,
                        "fabric halves": tuple(h.ip for h in node.fabric_halves)}, ports)


def applies(row: Row, host: HostContext) -> bool:
    return bool(row.roles & host.roles) and all(k in host.flags for k in row.when)


def resolved_ports(row: Row, host: HostContext) -> tuple[tuple[int | None, str], ...]:
    """The row's ports with its key's value in this node's data (offsets kept)."""
    if row.key is None or row.key not in host.ports:
        return row.ports
    shift = host.ports[row.key] - row.ports[0][0]
    return tuple((None if p is None else p + shift, proto) for p, proto in row.ports)


def bound_as(address: str, binds: tuple[str, ...], host: HostContext) -> bool:
    for bind in binds:
        if bind == "all addresses" and address in ALL_ADDRESSES:
            return True
        if bind == "fabric halves" and address in host.addresses.get("fabric halves", ()):
            return True
        if bind in ("fabric", "management") and address == host.addresses.get(bind):
            return True
        if address == bind:
            return True
    return False


def explains(row: Row, sock: Socket, host: HostContext, fixed: set[tuple[int, str]]) -> bool:
    if not set(sock.processes) & row.processes or not bound_as(sock.address, row.binds, host):
        return False
    for port, proto in resolved_ports(row, host):
        if proto == sock.proto and (port == sock.port or (port is None and sock.port in EPHEMERAL and (sock.port, proto) not in fixed)):
            return True
    return False


@dataclass(frozen=True)
class Differences:
    unexplained: list  # [Socket]: listening, and no row of this node says so
    missing: list  # [(Row, port, proto)]: a required row of this node with no socket

    def __bool__(self):
        return bool(self.unexplained or self.missing)

    def __str__(self):
        lines = [f"{s.proto} {s.address}:{s.port} {','.join(s.processes) or '?'}: no row of the table explains it"
                 for s in self.unexplained]
        lines += [f"{r.service}: no {proto} socket on port {p} held by {'/'.join(sorted(r.processes))}"
                  for r, p, proto in self.missing]
        return "\n".join(lines)


def compare(sockets: list[Socket], rows: list[Row], host: HostContext) -> Differences:
    """Every socket no row of this node explains, and every port of a required fixed-port row of this
    node that no socket holds."""
    mine = [r for r in rows if applies(r, host)]
    fixed = {(p, proto) for r in mine for p, proto in resolved_ports(r, host) if p is not None}
    unexplained = [s for s in sockets if not any(explains(r, s, host, fixed) for r in mine)]
    missing = []
    for r in mine:
        if not r.required:
            continue
        for port, proto in resolved_ports(r, host):
            if port is not None and not any(s.port == port and s.proto == proto and explains(r, s, host, fixed)
                                            for s in sockets):
                missing.append((r, port, proto))
    return Differences(unexplained, missing)


def capture_header(text: str) -> dict[str, str]:
    """A capture's `# key: value` header lines (its `# role:`), lowercased keys."""
    header = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        key, sep, value = line[1:].partition(":")
        if sep and key.strip() == "role":
            header["role"] = value.strip()
    return header


def check_host(ss_output: str, cluster, name: str, text: str | None = None) -> Differences:
    """The whole comparison for one node: `ss -ltnup`'s output against the table."""
    return compare(parse_ss(ss_output), table_rows(text), host_context(cluster, name))
