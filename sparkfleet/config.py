"""The one validated config model of a sparkfleet cluster.

Every role reads its settings from here. A node's data is flat (as pyinfra host data is): the
keys of every role's schema, plus the node's identity (name, rank, management address). Keys
pyinfra itself reads (``ssh_*`` connection settings, ``_sudo``-style global arguments) pass
through; any other key is refused, so a typo never silently falls back to a default.
"""
from __future__ import annotations

from collections import Counter
from ipaddress import IPv4Network
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pyinfra.connectors.ssh import ConnectorData as _SSHConnectorData

from roles.docker.schema import DockerData
from roles.fabric.schema import JUMBO_MTU, FabricData
from roles.fanout.schema import FanoutData
from roles.guards.schema import GuardsData
from roles.kernel_cache.schema import KernelCacheData
from roles.preflight.schema import PreflightData
from roles.serving.schema import ServingData, serving_problems
from roles.weights.schema import WeightsData

# Keys that belong to pyinfra, not to sparkfleet: connection settings and global arguments.
PYINFRA_KEYS = frozenset(_SSHConnectorData.__annotations__)


def is_pyinfra_key(key: str) -> bool:
    return key in PYINFRA_KEYS or key.startswith("_")


class ConfigError(Exception):
    """Bad cluster data. Each line names the host, the key, the value found and what is allowed."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid sparkfleet config:\n" + "\n".join(f"  - {p}" for p in problems))


class NodeConfig(KernelCacheData, WeightsData, FanoutData, GuardsData, ServingData, DockerData, FabricData, PreflightData):
    """One node's validated settings (the union of every role's schema)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Inventory name of the node.")
    rank: int = Field(ge=0, description="Tensor-parallel rank; rank 0 is the head. Required per node.")
    management_address: str = Field(
        description="Address used to reach the node over SSH (pyinfra `ssh_hostname`, else the name)."
    )

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    @property
    def fabric_ip(self) -> str:
        return str(self.fabric_address.ip)

    @property
    def ping_payload(self) -> int:
        """Largest ICMP payload that fits the MTU unfragmented: MTU - 20 (IPv4) - 8 (ICMP)."""
        return self.fabric_mtu - 28


# Keys a user may set in data, with their schema entry (used for errors and the README check).
DATA_FIELDS = {k: f for k, f in NodeConfig.model_fields.items() if k not in ("name", "management_address")}


def _describe_allowed(key: str) -> str:
    field = DATA_FIELDS.get(key)
    if field is None:
        return ""
    return f" ({field.description})" if field.description else ""


def _node_problems(name: str, err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "?"
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(sorted(DATA_FIELDS))
            problems.append(
                f"{name}: unknown key '{key}' = {e['input']!r}; allowed sparkfleet keys: {allowed} "
                f"(plus pyinfra's ssh_* and _* keys)"
            )
        elif e["type"] == "missing":
            problems.append(f"{name}: key '{key}' is required{_describe_allowed(key)}")
        else:
            problems.append(f"{name}: key '{key}' = {e['input']!r}: {e['msg']}{_describe_allowed(key)}")
    return problems


class ClusterConfig(BaseModel):
    """All nodes, with the invariants that only hold across nodes checked."""

    model_config = ConfigDict(frozen=True)

    nodes: tuple[NodeConfig, ...]

    @property
    def head(self) -> NodeConfig:
        return next(n for n in self.nodes if n.is_head)

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
            if name_or_address in (n.name, n.management_address):
                return n
        return None

    def peers(self, node: NodeConfig) -> tuple[NodeConfig, ...]:
        return tuple(n for n in self.nodes if n.name != node.name)

    def as_data(self) -> dict[str, dict[str, Any]]:
        """The merged, validated settings per node, as plain data (for printing)."""
        identity = ("name", "rank", "management_address")
        out = {}
        for n in sorted(self.nodes, key=lambda n: n.rank):
            dumped = n.model_dump(mode="json")
            out[n.name] = {**{k: dumped.pop(k) for k in identity}, **dumped}
        return out


def _cluster_problems(nodes: list[NodeConfig]) -> list[str]:
    problems: list[str] = []
    if len(nodes) < 2:
        problems.append(
            f"{', '.join(n.name for n in nodes) or '(no hosts)'}: a cluster needs at least 2 nodes "
            f"(found {len(nodes)}); tensor parallelism across nodes needs a peer on the fabric"
        )

    heads = [n.name for n in nodes if n.rank == 0]
    if len(heads) != 1:
        found = ", ".join(heads) if heads else "none"
        problems.append(
            f"{found}: key 'rank' = 0 on {len(heads)} nodes; exactly one node must have rank 0 (the head)"
        )
    by_rank = Counter(n.rank for n in nodes)
    for rank, count in sorted(by_rank.items()):
        if count > 1 and rank != 0:
            names = ", ".join(n.name for n in nodes if n.rank == rank)
            problems.append(f"{names}: key 'rank' = {rank} on {count} nodes; each rank must be used once")
    missing = sorted(set(range(len(nodes))) - set(by_rank))
    for n in nodes:
        if n.rank >= len(nodes):
            problems.append(
                f"{n.name}: key 'rank' = {n.rank}: ranks must be 0..{len(nodes) - 1} without gaps "
                f"(missing: {', '.join(map(str, missing))})"
            )

    by_ip = Counter(n.fabric_ip for n in nodes)
    for ip, count in by_ip.items():
        if count > 1:
            names = ", ".join(n.name for n in nodes if n.fabric_ip == ip)
            problems.append(f"{names}: key 'fabric_address' = {ip} on {count} nodes; addresses must be unique")

    networks: dict[IPv4Network, list[str]] = {}
    for n in nodes:
        networks.setdefault(n.fabric_address.network, []).append(n.name)
        net = n.fabric_address.network
        if net.prefixlen < 31 and n.fabric_address.ip in (net.network_address, net.broadcast_address):
            problems.append(
                f"{n.name}: key 'fabric_address' = {n.fabric_address}: that is the subnet's network or "
                f"broadcast address; use a host address of {n.fabric_address.network}"
            )
    if len(networks) > 1:
        found = "; ".join(f"{', '.join(names)} in {net}" for net, names in networks.items())
        problems.append(
            f"key 'fabric_address': all nodes must be in one subnet, found {found}"
        )

    for n in nodes:
        if n.fabric_mtu != JUMBO_MTU and not (n.fabric_mtu_reason or "").strip():
            problems.append(
                f"{n.name}: key 'fabric_mtu' = {n.fabric_mtu}: must be {JUMBO_MTU} (jumbo frames; NCCL "
                f"bandwidth drops ~7x without) unless 'fabric_mtu_reason' says why it differs on purpose"
            )
    mtus = {n.fabric_mtu for n in nodes}
    if len(mtus) > 1:
        found = ", ".join(f"{n.name}={n.fabric_mtu}" for n in nodes)
        problems.append(f"key 'fabric_mtu' differs between nodes ({found}); both ends of a link need one MTU")
    if nodes and not problems:
        problems.extend(serving_problems(nodes))
    return problems


def build_cluster(hosts: Iterable[tuple[str, Mapping[str, Any]]]) -> ClusterConfig:
    """Validate merged per-host data (defaults < group data < host data) into a ClusterConfig.

    Raises ConfigError listing every problem found, per node and across nodes.
    """
    problems: list[str] = []
    nodes: list[NodeConfig] = []
    for name, data in hosts:
        own = {k: v for k, v in data.items() if not is_pyinfra_key(k)}
        for reserved in ("name", "management_address"):
            if reserved in own:
                problems.append(
                    f"{name}: key '{reserved}' is derived (from the inventory name and ssh_hostname) "
                    f"and cannot be set in data"
                )
                own.pop(reserved)
        own["name"] = name
        own["management_address"] = str(data.get("ssh_hostname") or name)
        try:
            nodes.append(NodeConfig.model_validate(own))
        except ValidationError as err:
            problems.extend(_node_problems(name, err))
    if not problems:
        problems.extend(_cluster_problems(nodes))
    if problems:
        raise ConfigError(problems)
    return ClusterConfig(nodes=tuple(sorted(nodes, key=lambda n: n.rank)))
