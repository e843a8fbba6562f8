"""Each role's verdict, as its decide() returns it and the run's plan holds it (sparkfleet/decided.py).

On the ground floor: the roles import these, and so do the tools above them; this module imports no
role. Each type is frozen: a step reads its slice of the plan and changes nothing in it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sparkfleet.model.fabric import FabricHalf


@dataclass(frozen=True)
class NodeMemory:
    """A node's unified memory as preflight read it at prepare, in GiB: what the guards admit the
    engine against and size the KV cache from (roles/guards), and what the collective's buffer is
    sized from (roles/fabric_speed)."""
    total_gib: float
    available_gib: float


@dataclass(frozen=True)
class FabricState:
    converged: bool
    drift: dict[str, list[str]] = field(default_factory=dict)  # node name -> differences
    file_current: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class SpeedLink:
    """Two nodes of one serving group, and the halves of the port both configure (server: the lower rank)."""

    server: object  # NodeConfig
    client: object
    halves: tuple[tuple[FabricHalf, FabricHalf], ...]  # (server's half, client's half), first half first

    @property
    def name(self) -> str:
        return f"{self.client.name} -> {self.server.name}"


@dataclass(frozen=True)
class SpeedPlan:
    """The group's verdict: why the proof runs (None: it does not), and what it runs."""

    why: str | None
    key: str
    links: tuple[SpeedLink, ...]
    buffer_mib: int | None  # the collective's, when it runs
    buffer_why: str


@dataclass(frozen=True)
class ImagePlan:
    head_id: str | None  # the image's ID on the head before the run; None: the head builds it
    ship: list[str]  # workers that pull it from the head's registry (missing, another ID, or not
    #                        pinned to a digest the head pushed, and not holding one)
    repin: dict[str, str] = field(default_factory=dict)  # worker -> the head's digest ref its local copy
    #                  already holds (same ID), its pin file naming another: written again, nothing pulled
    ids: dict[str, str | None] = field(default_factory=dict)  # node -> image ID before the run
    worker_pins: dict[str, str | None] = field(default_factory=dict)  # worker -> its pin before the run

    @property
    def build(self) -> bool:
        return self.head_id is None

    @property
    def in_sync(self) -> bool:
        return not self.build and not self.ship

    @property
    def same_everywhere(self) -> bool:
        """Every node of the run had one image ID before the run, the head's included."""
        return None not in self.ids.values() and len(set(self.ids.values())) == 1


@dataclass(frozen=True)
class WeightsPlan:
    fetch: dict[str, str] = field(default_factory=dict)  # model -> why the head fetches it
    pull: dict[tuple[str, str], str] = field(default_factory=dict)  # (model, node) -> why it is sent


@dataclass(frozen=True)
class CachePlan:
    generation: str | None  # None: the image is built in this run, its engine and ID are not known yet
    prewarm: bool = False
    sync: dict[str, str] = field(default_factory=dict)  # node -> why its cache is brought in line
    link: list[str] = field(default_factory=list)  # nodes whose 'current' points elsewhere
    expire: dict[str, list[str]] = field(default_factory=dict)  # node -> generations removed
    why_prewarm: str | None = None
    # The image is built in this run and the head holds generations warmed by an engine for these
    # compile settings: whether the new image's engine is warmed in one of them (reuse, no prewarm)
    # or not (prewarm) is decided after the build, by the same decide() on the facts read then.
    after_build: bool = False
    why_after_build: str | None = None
    reused: str | None = None  # a warmed generation serves a new image: why (the engine and settings unchanged)

    @property
    def converge(self) -> bool:
        return self.prewarm or self.after_build or bool(self.sync or self.link or self.expire)


@dataclass(frozen=True)
class PairState:
    restart: bool
    reasons: tuple[str, ...] = ()
    files: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)  # node -> rendered files
    healthy: bool = False


@dataclass(frozen=True)
class WatchdogPlan:
    moves: str | None  # what moves the pair in this run ("the prewarm", "the pair restart"), or None
    running: dict[str, bool]  # node -> its watchdog ran at prepare time
    pause: tuple[str, ...]  # nodes whose watchdog this run stops before the pair moves, head first


@dataclass(frozen=True)
class FleetKey:
    """roles/router fleet_key.decide: the fleet's one API key behind the router and where it is
    written. The key is held in the controller's memory for the write's operation body only: it is in
    no repr, no printed line and no plan file (sparkfleet/plan_types.py FleetPlan carries the nodes)."""
    source: str  # the node whose key file is the fleet's (the router group's head)
    key: bytes = field(repr=False)  # the key file's content, as read at prepare (or generated)
    writes: dict[str, str] = field(default_factory=dict)  # node name -> key file path (re)written with `key`
    generated: bool = False  # nothing at the source's path: the controller generated the key


@dataclass(frozen=True)
class Backend:
    """One serving group as the router sees it, and as this run's plan has it (roles/rolling/routes.py)."""

    group: str
    url: str
    model: str
    state: str | None  # routed | unhealthy | draining | drained; None: not in the router's config yet
    healthy: bool  # its plan's probe: it serves
    restart: bool  # its plan restarts it (a turn that drains it, when it is routed)


@dataclass(frozen=True)
class RoutingPlan:
    """roles/rolling/routes.py decide: the router's routing as read at prepare, and what this run does
    to it. `last_routed` is refused by the composer (tools/plan.py) before any change."""
    router: str = ""  # the router node ("": none)
    states: dict[str, str | None] = field(default_factory=dict)  # group -> its state at the router
    note: str = ""  # why the routing was not read: the router is not running, or not answering
    route_again: tuple[str, ...] = ()  # groups put back before any turn
    drain: tuple[str, ...] = ()  # groups taken out of routing for their restart, in turn order
    last_routed: dict[str, str] = field(default_factory=dict)  # group -> why its drain is refused
    accepted: dict[str, str] = field(default_factory=dict)  # the same, with the outage accepted in data


@dataclass(frozen=True)
class FirewallPlan:
    """roles/firewall decide: one node's nftables table as this run leaves it, from the facts pass (the
    management subnet and the monitoring node's address as the node resolves them, the live table's
    marker, whether nft is installed). `problem` is refused by the composer (tools/plan.py) before any
    change; the firewall step renders its rules from `subnet` and `monitor` and decides nothing."""
    enabled: bool  # firewall_enabled: the table is wanted (else it is removed when live)
    live: str  # the live table's marker ('sparkfleet <sha1>'), '' when there is none
    want: str = ""  # the marker of the table data renders for the node ('' when disabled)
    subnet: str | None = None  # the management subnet the API is allowed from by default ('' unread)
    monitor: str | None = None  # the monitoring node's IPv4 address as the node resolves it ('' unresolved,
    #                             None without monitoring)
    problem: str | None = None  # why the run is refused for this node (management subnet, monitor address)
    install_nft: bool = False  # nft is not on the node: nftables is installed first

    @property
    def apply(self) -> bool:
        """The rendered table is applied (one nft transaction): it is not the live one."""
        return self.enabled and self.live != self.want

    @property
    def remove(self) -> bool:
        """firewall_enabled is false and a table is live: it, its unit and its files are removed."""
        return not self.enabled and bool(self.live)

    @property
    def changes(self) -> bool:
        """The node's live table changes in this run (roles/fabric: what may stop a ping before it)."""
        return self.apply or self.remove


@dataclass(frozen=True)
class TlsPlan:
    """roles/tls decide: TLS on every listener of the LAN for this run, from the facts pass (the fleet CA on
    its node, each certified node's certificate and its exporters' copy, each node's trust bundle).
    `problems` are refused by the composer (tools/plan.py) before any change; roles/tls executes the rest
    and decides nothing. The CA's key is in no fact: the facts carry its state (owner, mode, whether it
    matches the certificate), never it; nor is any node's key (only whether a copy is the same bytes)."""
    enabled: bool  # tls_enabled: the API speaks TLS (else plain HTTP, with `disabled_reason`)
    disabled_reason: str = ""
    ca_node: str | None = None  # the node that keeps the fleet CA (None: TLS off, or only sites' certificates)
    create_ca: bool = False  # the CA (its key, its certificate, whichever is missing) is made in this run
    ca_fingerprint: str = ""  # SHA-256 of the CA's certificate as read at prepare ('' unknown or created now)
    ca_not_after: int | None = None  # the CA's end, epoch seconds
    issue: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node -> why the fleet CA issues its
    #                                  certificate again (new key, new certificate) in this run
    assemble: dict[str, str] = field(default_factory=dict)  # node -> why its PEM is built again from
    #                                  the site's tls_cert_file and tls_key_file
    exporter_pem: dict[str, str] = field(default_factory=dict)  # node -> why the exporters' copy of its PEM
    #                                  is written (and its exporters restarted to serve it)
    bundle: dict[str, str] = field(default_factory=dict)  # node -> why its trust bundle (ca.crt; on the
    #                                  monitoring node Prometheus' copy too) is written
    hop: dict[str, tuple[str, ...]] = field(default_factory=dict)  # the router node -> why the fleet CA issues
    #                                  the router hop's client certificate again (smg restarts to present it)
    site_cas: tuple[str, ...] = ()  # the sites' CA certificates (PEM, public) the bundle holds besides the CA's
    days_left: dict[str, int] = field(default_factory=dict)  # node -> days its certificate has left (read)
    hop_days_left: dict[str, int] = field(default_factory=dict)  # the router node -> days the hop's has left
    problems: tuple[str, ...] = ()  # refusals
    warnings: tuple[str, ...] = ()  # printed, the run goes on

    def reloads(self, node: str) -> bool:
        """The node gets a new certificate in this run (its API proxy is reloaded to serve it)."""
        return node in self.issue or node in self.assemble

    @property
    def changes(self) -> bool:
        return bool(self.create_ca or self.issue or self.assemble or self.exporter_pem or self.bundle or self.hop)
