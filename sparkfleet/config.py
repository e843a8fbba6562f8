"""The one validated config model of a sparkfleet cluster.

Every role reads its settings from here. A node's data is flat (as pyinfra host data is): the
keys of every role's schema, plus the node's identity (name, rank, management address). Keys
pyinfra itself reads (``ssh_*`` connection settings, ``_sudo``-style global arguments) pass
through; any other key is refused, so a typo never silently falls back to a default.
"""
from __future__ import annotations

import difflib
from collections import Counter
from ipaddress import IPv4Network, ip_address
from types import SimpleNamespace
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pyinfra.connectors.ssh import ConnectorData as _SSHConnectorData

from sparkfleet.model.api_proxy import ApiProxyData
from sparkfleet.model.docker import DockerData
from sparkfleet.model.engine import engine_args, pinned_env
from sparkfleet.model.fabric import FABRIC_TOPOLOGIES, JUMBO_MTU, FabricData, FabricHalf
from sparkfleet.model.engine_proof import EngineProofData
from sparkfleet.model.fabric_speed import FabricSpeedData, fabric_speed_problems
from sparkfleet.model.fanout import FanoutData
from sparkfleet.model.fingerprint import FingerprintData
from sparkfleet.model.firewall import FirewallData
from sparkfleet.model.guard_rules import license_gate, refused_settings
from sparkfleet.model.guards import GuardsData
from sparkfleet.model.host import HostData
from sparkfleet.model.image import ImageData
from sparkfleet.model.kernel_cache import KernelCacheData
from sparkfleet.model.management import ManagementData
from sparkfleet.model.monitoring import MonitoringData, monitoring_problems
from sparkfleet.model.preflight import PreflightData
from sparkfleet.model.progress import ProgressData
from sparkfleet.model.receipt import ReceiptData
from sparkfleet.model.router import RouterData, router_problems
from sparkfleet.model.serving_group import serving_problems
from sparkfleet.model.tls import TlsData, tls_problems
from sparkfleet.model.serving import SECRET_BEARING_KEYS, ServingData, node_profile, withhold_secrets
from sparkfleet.model.watchdog import WatchdogData, watchdog_problems
from sparkfleet.model.weights import WeightsData
from sparkfleet.refusal import Problem, Refusal, as_problem
from sparkfleet import addresses
from sparkfleet.grammar import node_grammar_problems
from sparkfleet.values import node_value_problems

# Keys that belong to pyinfra, not to sparkfleet: connection settings and global arguments.
PYINFRA_KEYS = frozenset(_SSHConnectorData.__annotations__)


def is_pyinfra_key(key: str) -> bool:
    return key in PYINFRA_KEYS or key.startswith("_")


class ConfigError(Refusal):
    """Bad cluster data: every problem found, each naming the host, the key, the value found and
    what is allowed (sparkfleet.refusal.Problem lines)."""

    def __init__(self, problems: list[str], title: str = "invalid sparkfleet config", footer: str | None = None):
        super().__init__(title, problems, footer)


# Names a group appears under in unit names, receipts and tables: short, lower case, no spaces.
GROUP_NAME = r"^[a-z0-9][a-z0-9-]{0,30}$"
DEFAULT_GROUP = "pair"


class GroupData(BaseModel):
    serving_group: str = Field(
        DEFAULT_GROUP, pattern=GROUP_NAME,
        description="the serving group of the node: the nodes that serve one model together (own head, ranks, "
        "profile, TP x PP = its node count, ports); several groups make a fleet, a node belongs to exactly one (see "
        "docs/fleet.md#a-fleet-serving-groups); lower case, digits and `-`",
        json_schema_extra={"set_in": "inventory, per node"},
    )


class NodeConfig(GroupData, TlsData, MonitoringData, EngineProofData, FabricSpeedData, ApiProxyData, RouterData, ReceiptData, WatchdogData, FirewallData, KernelCacheData, WeightsData, FanoutData, ImageData,
                 FingerprintData, GuardsData, ServingData, DockerData, HostData, FabricData, PreflightData,
                 ManagementData, ProgressData):
    """One node's validated settings (the union of every role's schema)."""

    # strict: a number written as text ('9000'), a boolean as 'yes' or 1, is refused, not converted.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(description="Inventory name of the node.")
    rank: int = Field(
        ge=0,
        description="rank within the node's serving group; exactly one node of a group has 0 (its head), a group's "
        "ranks are 0..N-1 without gaps",
    )
    management_address: str = Field(
        description="The node's management IP address: what the router's backends, the scrape targets and the "
        "firewall name (sparkfleet/addresses.py). `ssh_hostname` (else the inventory name) when it is an IP "
        "literal, else the one IPv4 address it resolved to on the controller, once, before any connection."
    )
    management_given: str = Field(
        description="The management address as the inventory gives it: `ssh_hostname`, else the inventory name."
    )

    @property
    def management_how(self) -> str:
        """How management_address was decided: given, resolved on the controller, or pyinfra's @local."""
        if self.name == addresses.LOCAL_CONNECTOR and self.management_given == self.name:
            return addresses.CONNECTOR
        return addresses.GIVEN if addresses.is_ip_literal(self.management_given) else addresses.RESOLVED

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def fabric_ip(self) -> str:
        return str(self.fabric_address.ip)

    @property
    def fabric_halves(self) -> tuple[FabricHalf, ...]:
        """The port's halves this node configures: the first, then the twin when data names it."""
        first = FabricHalf(self.fabric_netdev, self.fabric_address, self.rdma_hca)
        if self.fabric_twin_netdev is None or self.fabric_twin_address is None:
            return (first,)
        return first, FabricHalf(self.fabric_twin_netdev, self.fabric_twin_address, self.rdma_twin_hca)

    @property
    def rdma_hcas(self) -> tuple[str, ...]:
        """Every RDMA device NCCL carries the collectives over (NCCL_IB_HCA), first half first."""
        return tuple(h.hca for h in self.fabric_halves if h.hca)

    @property
    def ping_payload(self) -> int:
        """Largest ICMP payload that fits the MTU unfragmented: MTU - 20 (IPv4) - 8 (ICMP)."""
        return self.fabric_mtu - 28


# Keys a user may set in data, with their schema entry (used for errors and the README check).
DERIVED = ("name", "management_address", "management_given")
DATA_FIELDS = {k: f for k, f in NodeConfig.model_fields.items() if k not in DERIVED}


def _describe_allowed(key: str) -> str:
    field = DATA_FIELDS.get(key)
    if field is None:
        return ""
    return f" ({field.description})" if field.description else ""


_TYPE_WORDS = {"int_type": "a whole number", "float_type": "a number", "bool_type": "true or false",
               "string_type": "text (in quotes)", "list_type": "a list", "dict_type": "a mapping"}


def _unquoted(value: Any, kind: str) -> str | None:
    """How a value written as text should have been written, when the text is one ('9000' -> 9000)."""
    if kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"text: '{value}' (with --data, KEY='\"{value}\"': pyinfra reads bare digits as a number)"
    if not isinstance(value, str):
        return None
    text = value.strip()
    if kind == "bool_type" and text.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return "True or False in Python data, true or false with --data"
    try:
        number = int(text) if kind == "int_type" else float(text) if kind == "float_type" else None
    except ValueError:
        return None
    return None if number is None else f"{number} without quotes"


def _node_problems(name: str, err: ValidationError) -> list[Problem]:
    problems = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "?"
        top = str(e["loc"][0]) if e["loc"] else None
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(DATA_FIELDS))
            close = difflib.get_close_matches(key, list(DATA_FIELDS), n=1)
            problems.append(Problem(
                f"unknown key '{key}' = {e['input']!r}; allowed sparkfleet keys: {allowed} (plus pyinfra's ssh_* "
                f"and _* keys)", [name], key=top,
                fix=(f"did you mean '{close[0]}'? " if close else "") + "rename or remove it",
            ))
        elif e["type"] == "missing":
            problems.append(Problem(f"key '{key}' is required{_describe_allowed(top)}", [name], key=top,
                                    fix="set it for every node (per node: in the inventory's host data)"))
        else:
            hint = _unquoted(e["input"], e["type"])
            want = _TYPE_WORDS.get(e["type"])
            msg = e["msg"] + (f" (found {type(e['input']).__name__}, want {want})" if want else "")
            shown = withhold_secrets(e["input"]) if top in SECRET_BEARING_KEYS else e["input"]
            problems.append(Problem(
                f"key '{key}' = {shown!r}: {msg}{_describe_allowed(top)}", [name], key=top,
                fix=f"write it as {hint}" if hint else None,
            ))
    return problems


class ClusterConfig(BaseModel):
    """All nodes, with the invariants that only hold across nodes checked: a fleet of one or more
    serving groups, or (group set) one serving group of it. Inside a deploy each host sees its own
    group (sparkfleet.inventory.cluster_from_state); fleet-wide steps read the fleet
    (fleet_from_state)."""

    model_config = ConfigDict(frozen=True)

    nodes: tuple[NodeConfig, ...]
    group: str | None = None  # the serving group these nodes are; None: the whole fleet

    @property
    def groups(self) -> dict[str, "ClusterConfig"]:
        """Serving group name -> that group's nodes (in name order)."""
        names = sorted({n.serving_group for n in self.nodes})
        return {g: ClusterConfig(nodes=tuple(n for n in self.nodes if n.serving_group == g), group=g) for g in names}

    def group_of(self, name: str) -> "ClusterConfig":
        """The serving group of the node named `name`."""
        return self.groups[self.node(name).serving_group]

    @property
    def head(self) -> NodeConfig:
        heads = [n for n in self.nodes if n.is_head]
        if len(heads) != 1:
            raise ValueError(f"a fleet of {len(self.groups)} serving groups has no single head "
                             f"({', '.join(n.name for n in heads)}); read a group's head: cluster.groups[name].head")
        return heads[0]

    @property
    def workers(self) -> tuple[NodeConfig, ...]:
        return tuple(n for n in self.nodes if not n.is_head)

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in the cluster ({', '.join(n.name for n in self.nodes)})")

    def find(self, name_or_address: str) -> NodeConfig | None:
        for n in self.nodes:
            if name_or_address in (n.name, n.management_address, n.management_given):
                return n
        return None

    def peers(self, node: NodeConfig) -> tuple[NodeConfig, ...]:
        return tuple(n for n in self.nodes if n.name != node.name)

    def as_data(self) -> dict[str, dict[str, Any]]:
        """The merged, validated settings per node, as plain data (for printing)."""
        identity = ("name", "rank", "management_address", "management_given")
        out = {}
        for n in sorted(self.nodes, key=lambda n: n.rank):
            dumped = n.model_dump(mode="json")
            out[n.name] = {**{k: dumped.pop(k) for k in identity}, **dumped}
        return out


def _in_group(group: str, several: bool) -> str:
    """'group g1: ' in a fleet of several groups, nothing for today's single pair."""
    return f"serving group '{group}': " if several else ""


def _cluster_problems(nodes: list[NodeConfig], ssh_ports: Mapping[str, Any] | None = None) -> list[Problem]:
    """The fleet's invariants (addresses, topology), then each serving group's own."""
    groups: dict[str, list[NodeConfig]] = {}
    for n in nodes:
        groups.setdefault(n.serving_group, []).append(n)
    several = len(groups) > 1
    problems: list[Problem] = []
    if not nodes:
        problems.append(Problem("a cluster needs at least 2 nodes (found 0)", ["(no hosts)"],
                                fix="declare every node of the cluster in the inventory"))
    for group, members in sorted(groups.items()):
        problems += _rank_problems(members, _in_group(group, several))
    problems += _fabric_problems(nodes, groups, several)
    problems += _management_problems(nodes, ssh_ports or {})
    problems += router_problems(nodes)  # one router for the fleet, on a node of the inventory (roles/router)
    problems += monitoring_problems(nodes)  # one monitoring stack for the fleet (roles/monitoring)
    problems += tls_problems(nodes)  # TLS on every API, one CA for the fleet (roles/tls)
    for n in nodes:  # values that would break a file or a shell; directories sparkfleet owns; names' grammars
        problems.extend(node_value_problems(n))
        problems.extend(node_grammar_problems(n))
    for group, members in sorted(groups.items()):
        prefix = _in_group(group, several)
        names = [n.name for n in members]
        # one watchdog per group; its grace and window fit a cold start
        group_problems = [_prefixed(p, prefix) for p in watchdog_problems(members) + fabric_speed_problems(members)]
        if not group_problems and not problems:
            group_problems += [as_problem(prefix + p, names) for p in serving_problems(members)]
        if not group_problems and not problems:
            group_problems += [_prefixed(p, prefix) for p in _data_only_guards(members)]
        problems += group_problems
    return problems


def _prefixed(problem: Problem, prefix: str) -> Problem:
    return problem.replace(detail=prefix + problem.detail) if prefix else problem


def _rank_problems(nodes: list[NodeConfig], prefix: str) -> list[Problem]:
    """One head, ranks 0..N-1 once each, and a peer: within one serving group."""
    problems: list[Problem] = []
    names = [n.name for n in nodes]
    if len(nodes) < 2:
        problems.append(Problem(
            f"{prefix}a serving group needs at least 2 nodes (found {len(nodes)}: {', '.join(names)}); tensor "
            f"parallelism across nodes needs a peer on the fabric", names,
            key="serving_group" if prefix else None,
            fix="declare every node of the group in the inventory" + (" (or set its serving_group to a group with "
                                                                       "a peer)" if prefix else ""),
        ))

    heads = [n.name for n in nodes if n.rank == 0]
    if len(heads) != 1:
        found = "" if heads else f" (ranks found: {', '.join(f'{n.name}={n.rank}' for n in nodes)})"
        problems.append(Problem(
            f"{prefix}key 'rank' = 0 on {len(heads)} nodes{found}; exactly one node must have rank 0 (the head)",
            heads or names, key="rank", fix="give exactly one node rank 0 and the others 1..N-1",
        ))
    by_rank = Counter(n.rank for n in nodes)
    for rank, count in sorted(by_rank.items()):
        if count > 1 and rank != 0:
            problems.append(Problem(f"{prefix}key 'rank' = {rank} on {count} nodes; each rank must be used once",
                                    [n.name for n in nodes if n.rank == rank], key="rank",
                                    fix="give each node its own rank"))
    missing = sorted(set(range(len(nodes))) - set(by_rank))
    for n in nodes:
        if n.rank >= len(nodes):
            problems.append(Problem(
                f"{prefix}key 'rank' = {n.rank}: ranks must be 0..{len(nodes) - 1} without gaps "
                f"(missing: {', '.join(map(str, missing))})", [n.name], key="rank",
            ))
    return problems


def _twin_problems(nodes: list[NodeConfig], groups: dict[str, list[NodeConfig]], several: bool) -> list[Problem]:
    """The port's second half: named with its address (and its HCA when the first has one), the
    same on both ends of a cable, never the first half's netdev."""
    problems: list[Problem] = []
    for n in nodes:
        if n.fabric_twin_netdev is None:
            for key in ("fabric_twin_address", "rdma_twin_hca"):
                if getattr(n, key) is not None:
                    problems.append(Problem(
                        f"key '{key}' = {getattr(n, key)} without 'fabric_twin_netdev': there is no twin to give it "
                        f"to", [n.name], key=key, fix="set fabric_twin_netdev (the DGX Spark's is 'enP2p1s0f0np0'), "
                        f"or remove the key"))
            continue
        if n.fabric_twin_netdev == n.fabric_netdev:
            problems.append(Problem(
                f"key 'fabric_twin_netdev' = {n.fabric_twin_netdev!r} is fabric_netdev too; the twin is the port's "
                f"other half", [n.name], key="fabric_twin_netdev"))
        if n.fabric_twin_address is None:
            problems.append(Problem(
                f"key 'fabric_twin_address' missing: fabric_twin_netdev = {n.fabric_twin_netdev!r} needs an address "
                f"in a subnet of its own (e.g. {_twin_example(n)})", [n.name], key="fabric_twin_address",
                fix="give each node's twin an address in the inventory, or set fabric_twin_netdev = None to leave the "
                "twin alone (NCCL then runs over one half: about half of what the cable carries)"))
        if n.rdma_hca and not n.rdma_twin_hca:
            problems.append(Problem(
                f"key 'rdma_twin_hca' missing: rdma_hca = {n.rdma_hca!r} and fabric_twin_netdev = "
                f"{n.fabric_twin_netdev!r}, but the twin's RDMA device is not named, so NCCL would leave that half idle",
                [n.name], key="rdma_twin_hca", fix="set rdma_twin_hca (the DGX Spark's is 'roceP2p1s0f0'; "
                "`ibdev2netdev` shows it)"))
        if n.rdma_twin_hca and not n.rdma_hca:
            problems.append(Problem(
                f"key 'rdma_twin_hca' = {n.rdma_twin_hca!r} without 'rdma_hca': NCCL uses RDMA on both halves or "
                f"on none", [n.name], key="rdma_twin_hca"))
        if n.rdma_twin_hca and n.rdma_twin_hca == n.rdma_hca:
            problems.append(Problem(
                f"key 'rdma_twin_hca' = {n.rdma_twin_hca!r} is rdma_hca too; each half has its own RDMA device",
                [n.name], key="rdma_twin_hca"))
    for group, members in sorted(groups.items()):
        kinds = {(n.fabric_twin_netdev is None, not n.rdma_twin_hca) for n in members}
        if len(kinds) > 1:
            found = ", ".join(f"{n.name}: {n.fabric_twin_netdev or 'no twin'}"
                              f"{'/' + n.rdma_twin_hca if n.rdma_twin_hca else ''}" for n in members)
            problems.append(Problem(
                f"{_in_group(group, several)}key 'fabric_twin_netdev': a cable joins the same halves at both ends, "
                f"found {found}", [n.name for n in members], key="fabric_twin_netdev",
                fix="set the twin (and its HCA) on every node of the group, or on none"))
    return problems


def _twin_example(n: NodeConfig) -> str:
    net = n.fabric_address.network
    nxt = IPv4Network((int(net.network_address) + net.num_addresses, net.prefixlen)) \
        if int(net.broadcast_address) < 2**32 - 1 else net
    offset = int(n.fabric_address.ip) - int(net.network_address)
    return f"{nxt.network_address + offset}/{net.prefixlen}"


def _half_address_problems(nodes: list[NodeConfig], groups: dict[str, list[NodeConfig]], several: bool,
                           topology: str, key: str) -> list[Problem]:
    """One half's addresses (`key`: fabric_address or fabric_twin_address): no network or broadcast
    address; the subnets the topology requires."""
    problems: list[Problem] = []
    members_of = {g: [n for n in ms if getattr(n, key) is not None] for g, ms in groups.items()}
    nodes = [n for n in nodes if getattr(n, key) is not None]
    for n in nodes:
        address = getattr(n, key)
        net = address.network
        if net.prefixlen < 31 and address.ip in (net.network_address, net.broadcast_address):
            problems.append(Problem(
                f"key '{key}' = {address}: that is the subnet's network or broadcast address; "
                f"use a host address of {net}", [n.name], key=key,
            ))
    for group, members in sorted(members_of.items()):
        networks: dict[IPv4Network, list[str]] = {}
        for n in members:
            networks.setdefault(getattr(n, key).network, []).append(n.name)
        if len(networks) > 1:
            found = "; ".join(f"{', '.join(ns)} in {net}" for net, ns in networks.items())
            where = "the nodes of a link" if topology == "back-to-back" else "the nodes of a group on the switch"
            problems.append(Problem(
                f"{_in_group(group, several)}key '{key}': {where} must be in one subnet, found {found}",
                [n.name for n in members], key=key, fix=f"put every {key} of the group in one subnet",
            ))
    if topology == "back-to-back" and several:
        # Separate cables: a subnet shared by two links would route one group's traffic out of the other's port.
        owners: dict[IPv4Network, set[str]] = {}
        for n in nodes:
            owners.setdefault(getattr(n, key).network, set()).add(n.serving_group)
        for net, shared in sorted(owners.items(), key=lambda kv: str(kv[0])):
            if len(shared) > 1:
                problems.append(Problem(
                    f"key '{key}': subnet {net} is used by the back-to-back links of serving groups "
                    f"{', '.join(sorted(shared))}; each cable needs its own subnet",
                    [n.name for n in nodes if getattr(n, key).network == net], key=key,
                    fix="give each group's link its own subnet",
                ))
    return problems


def _fabric_problems(nodes: list[NodeConfig], groups: dict[str, list[NodeConfig]], several: bool) -> list[Problem]:
    """Addresses unique in the fleet, over both halves of every port; the subnets the topology
    requires, per half: back-to-back, one cable per group of two, one subnet per link; switched,
    one subnet per group (one segment); no subnet shared by the two halves; one MTU on every link
    (per group; on a switch, per segment)."""
    problems: list[Problem] = _twin_problems(nodes, groups, several)

    owners: dict[str, list[tuple[str, str]]] = {}
    for n in nodes:
        for key in ("fabric_address", "fabric_twin_address"):
            if getattr(n, key) is not None:
                owners.setdefault(str(getattr(n, key).ip), []).append((n.name, key))
    for ip, where in owners.items():
        if len(where) > 1:
            keys = sorted({k for _, k in where})
            problems.append(Problem(
                f"key '{keys[0]}' = {ip} used {len(where)} times ({', '.join(f'{name} {k}' for name, k in where)}); "
                f"addresses must be unique", sorted({name for name, _ in where}), key=keys[0],
                fix="give each node its own address in the fabric subnet"))

    topologies = Counter(n.fabric_topology for n in nodes)
    if len(topologies) > 1:
        found = ", ".join(f"{n.name}={n.fabric_topology!r}" for n in nodes)
        problems.append(Problem(
            f"key 'fabric_topology' differs between nodes ({found}); allowed: {', '.join(map(repr, FABRIC_TOPOLOGIES))}, "
            f"one for the whole fleet", [n.name for n in nodes], key="fabric_topology",
            fix="set it once for every node (group_data)",
        ))
        return problems
    topology = nodes[0].fabric_topology if nodes else "back-to-back"
    for key in ("fabric_address", "fabric_twin_address"):
        problems += _half_address_problems(nodes, groups, several, topology, key)
    first_nets = {n.fabric_address.network: n.name for n in nodes}
    for n in nodes:
        if n.fabric_twin_address is None:
            continue
        twin_net = n.fabric_twin_address.network
        clash = next((net for net in first_nets if net.overlaps(twin_net)), None)
        if clash is not None:
            problems.append(Problem(
                f"key 'fabric_twin_address' = {n.fabric_twin_address}: its subnet overlaps {clash}, the first half's "
                f"(fabric_address of {first_nets[clash]}); two netdevs of a host in one subnet share one route and "
                f"answer each other's ARP, so the kernel would send the twin's traffic out of the first half",
                [n.name], key="fabric_twin_address", fix=f"put the twins in a subnet of their own (e.g. "
                f"{_twin_example(n)})"))
    for group, members in sorted(groups.items()):
        prefix = _in_group(group, several)
        names = [n.name for n in members]
        if topology == "back-to-back" and len(members) > 2:
            problems.append(Problem(
                f"{prefix}key 'fabric_topology' = 'back-to-back' with {len(members)} nodes ({', '.join(names)}): a "
                f"back-to-back cable joins two nodes; allowed: {', '.join(map(repr, FABRIC_TOPOLOGIES))}", names,
                key="fabric_topology", fix="set fabric_topology = 'switch' for nodes on one switch, or split the "
                "nodes into serving groups of two",
            ))
        mtus = {n.fabric_mtu for n in members}
        if len(mtus) > 1:
            found = ", ".join(f"{n.name}={n.fabric_mtu}" for n in members)
            problems.append(Problem(
                f"{prefix}key 'fabric_mtu' differs between nodes ({found}); every end of a link needs one MTU",
                names, key="fabric_mtu"))
    if topology == "switch":
        mtus = {n.fabric_mtu for n in nodes}
        if len(mtus) > 1:
            found = ", ".join(f"{n.name}={n.fabric_mtu}" for n in nodes)
            problems.append(Problem(
                f"key 'fabric_mtu' differs between nodes on one switched segment ({found}); a segment has one MTU",
                [n.name for n in nodes], key="fabric_mtu"))

    for n in nodes:
        if n.fabric_mtu != JUMBO_MTU and not (n.fabric_mtu_reason or "").strip():
            problems.append(Problem(
                f"key 'fabric_mtu' = {n.fabric_mtu}: must be {JUMBO_MTU} (jumbo frames; NCCL bandwidth drops ~7x "
                f"without) unless 'fabric_mtu_reason' says why it differs on purpose", [n.name], key="fabric_mtu",
            ))
    return problems


def _management_problems(nodes: list[NodeConfig], ssh_ports: Mapping[str, Any]) -> list[Problem]:
    """Every node is reached at its own management address (two names resolving to one address are one
    machine), which is not on the fabric (the deploy reconfigures that link: SSH over it would be cut).
    Another node's name as ssh_hostname is refused before resolving (sparkfleet/addresses.py pin)."""
    problems: list[Problem] = []
    by_target: dict[tuple[str, Any], list[str]] = {}
    for n in nodes:
        by_target.setdefault((n.management_address, ssh_ports.get(n.name) or 22), []).append(n.name)
    for (address, port), names in by_target.items():
        if len(names) > 1:
            problems.append(Problem(
                f"key 'ssh_hostname' = {address!r} (port {port}) on {len(names)} nodes{_as_given(nodes, names, address)}; "
                f"each node needs its own management address", names, key="ssh_hostname",
                fix="set each node's ssh_hostname (or ssh_port) to the machine it names",
            ))
    fabric_ips = {h.ip: n for n in nodes for h in n.fabric_halves}
    for n in nodes:
        ip = ip_address(n.management_address)  # an IP literal: given, or resolved once (sparkfleet/addresses.py)
        shown = (n.management_address if n.management_given == n.management_address
                 else f"{n.management_given!r} (resolved to {n.management_address} on the controller)")
        owner = fabric_ips.get(str(ip))
        subnets = {h.address.network for m in nodes for h in m.fabric_halves}
        if owner is not None:
            problems.append(Problem(
                f"key 'ssh_hostname' = {shown} is {owner.name}'s fabric_address; the management "
                f"address must be off the fabric (the deploy reconfigures that link)",
                [n.name], key="ssh_hostname",
                fix="use the node's management-network address for ssh_hostname",
            ))
        elif any(ip in net for net in subnets):
            problems.append(Problem(
                f"key 'ssh_hostname' = {shown} is in the fabric subnet "
                f"{', '.join(sorted(str(s) for s in subnets if ip in s))}; the management address must be off the fabric (the deploy "
                f"reconfigures that link)", [n.name], key="ssh_hostname",
                fix="use the node's management-network address for ssh_hostname",
            ))
    return problems


def _as_given(nodes: list[NodeConfig], names: list[str], address: str) -> str:
    """' (spark-a: spark-a.lan, ...)' when a name resolved to the shared address, else nothing."""
    given = {n.name: n.management_given for n in nodes if n.name in names and n.management_given != address}
    return f" ({', '.join(f'{k}: {v}' for k, v in given.items())} resolved to it on the controller)" if given else ""


def head_license(profile) -> str:
    """The licence id of the profile's drafter, as the profile spells it."""
    return profile.speculative.draft_license if profile.speculative else ""


def _data_only_guards(nodes: list[NodeConfig]) -> list[Problem]:
    """The guards that need no facts: the drafter license gate, the head's ports, refused settings in
    what every rank would run. The same functions the deploy's guards run (sparkfleet/model/guard_rules.py)."""
    shape = SimpleNamespace(nodes=nodes, head=next(n for n in nodes if n.is_head))
    head, profile = shape.head, node_profile(shape.head)
    names = [n.name for n in nodes]
    problems: list[Problem] = []
    gate = license_gate(profile, head.deployment_purpose, head.drafter_license_acknowledged)
    if gate:
        key = "deployment_purpose" if head.deployment_purpose == "production" else "drafter_license_acknowledged"
        # The choice is the user's: made in the site's data, never in the checkout's shipped defaults.
        site_data = f"{head.serving_site}/group_data/all.py" if head.serving_site else "your site's group_data/all.py"
        choice = (f"drafter_license_acknowledged = {head_license(profile)!r}" if key == "drafter_license_acknowledged"
                  else "serving_profile = a profile whose drafter is not non-commercial")
        problems.append(Problem(f"key '{key}' = {getattr(head, key)!r}: {gate}", [head.name], key=key,
                                fix=f"make the choice in {site_data}: {choice}"))
    # (what, port, the data key that sets it): everything that listens on the head must differ.
    ports = [("docker_registry_port", head.docker_registry_port, "docker_registry_port"),
             ("fanout_rsync_port", head.fanout_rsync_port, "fanout_rsync_port"),
             ("fanout_http_port", head.fanout_http_port, "fanout_http_port"),
             (f"profile {profile.name}'s port", profile.port, None),
             (f"profile {profile.name}'s master_port", profile.master_port, None),
             ("api_proxy_engine_port", head.api_proxy_engine_port, "api_proxy_engine_port")]
    for i, (what, port, key) in enumerate(ports):
        for other, other_port, other_key in ports[:i]:
            if port == other_port:
                change = other_key or key
                problems.append(Problem(
                    f"port {port} is both {other} and {what}; each listens on the head, so every port must differ",
                    [head.name], key=change,
                    fix=f"set {change} to a free port" if change else "change one of the profile's ports",
                ))
    for n in nodes:
        env = pinned_env(profile, n)
        problems.extend(
            as_problem(p, names) for p in refused_settings(
                n.name, engine_args(profile, shape, n), env, n.is_head, profile.engine, n.allow_ray_backend))
    return problems


def _login_problems(name: str, data: Mapping[str, Any]) -> list[Problem]:
    """The deploy reads and writes root-only files (the API keys, the router's control-plane key): a
    node's SSH login must be root, or another user with pyinfra's `_sudo`. Without, every key file
    would be unreadable to it (sparkfleet/keyfiles.py refuses those at prepare, naming each)."""
    user = data.get("ssh_user")
    if user is None or user == "root" or data.get("_sudo") is True:
        return []
    return [Problem(f"key 'ssh_user' = {user!r} without key '_sudo' = True; the deploy reads and writes root-only "
                    f"files (the API key): allowed: ssh_user 'root', or any user with _sudo = True (sudo without a "
                    f"password prompt, or _sudo_password)", [name], key="ssh_user",
                    fix="set ssh_user to 'root', or _sudo: True for this host")]


def build_cluster(hosts: Iterable[tuple[str, Mapping[str, Any]]]) -> ClusterConfig:
    """Validate merged per-host data (defaults < group data < host data) into a ClusterConfig.

    Raises ConfigError listing the problems found, in stages: every node's own data (the schema, the
    login) for all nodes at once; only when all pass, the invariants across nodes (ranks, addresses,
    topology, router, monitoring, values, watchdog); only when those pass, each group's profile, then
    every guard that needs no facts. A fix can therefore show the next stage's problems.
    """
    problems: list[Problem] = []
    nodes: list[NodeConfig] = []
    ssh_ports: dict[str, Any] = {}
    hosts = [(name, data) for name, data in hosts]
    names = {name for name, _ in hosts}
    for name, data in hosts:
        own = {k: v for k, v in data.items() if not is_pyinfra_key(k)}
        for reserved in DERIVED:
            if reserved in own:
                problems.append(Problem(
                    f"key '{reserved}' is derived (from the inventory name and ssh_hostname) and cannot be set in "
                    f"data", [name], key=reserved, fix="remove it",
                ))
                own.pop(reserved)
        problems.extend(_login_problems(name, data))
        own["name"] = name
        own["management_given"] = str(data.get("ssh_hostname") or name)
        own["management_address"] = own["management_given"]  # the IP literal once pinned, below
        ssh_ports[name] = data.get("ssh_port")
        try:
            node = NodeConfig.model_validate(own)
        except ValidationError as err:
            problems.extend(_node_problems(name, err))
            continue
        # Before any connection and once per process: a name is resolved here, on the controller, and
        # every template renders the address it gave (sparkfleet/addresses.py).
        pinned = addresses.pin(name, data, node.management_resolve_mdns_once, names)
        if isinstance(pinned, Problem):
            problems.append(pinned)
        else:
            nodes.append(node.model_copy(update={"management_address": pinned.address}))
    if not problems:
        problems.extend(_cluster_problems(nodes, ssh_ports))
    if problems:
        raise ConfigError(problems)
    return ClusterConfig(nodes=tuple(sorted(nodes, key=lambda n: (n.serving_group, n.rank))))
