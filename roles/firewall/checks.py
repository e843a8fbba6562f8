"""roles/firewall: the node's ruleset file, its unit and nftables' drop-in, and the checks around them:
the reader of the plan's facts pass (firewall_facts), the verdict (decide: a FirewallPlan per node,
taken once at step 1b), the plan's line, the doctor's row and the refusals.

The rules themselves are rendered on the ground floor (sparkfleet/firewall_rules.py, which says what
they drop and admit), and the facts read of a node's table and addresses are there too
(sparkfleet/firewall_facts.py): roles/fabric weighs both when a ping fails.
"""
from dataclasses import dataclass
from ipaddress import IPv4Network

from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import Which

from sparkfleet.firewall_facts import LiveMarker, ManagementSubnet, is_ipv4
from sparkfleet.firewall_rules import wanted_marker_of
from sparkfleet.inventory import cluster_from_state, fleet_from_state
from sparkfleet.model.firewall import TABLE
from sparkfleet.model.monitoring import monitoring_node_name
from sparkfleet.once import per_host
from sparkfleet.render import render
from sparkfleet.verdicts import FirewallPlan

UNIT = "sparkfleet-firewall"
UNIT_PATH = f"/etc/systemd/system/{UNIT}.service"
# The distribution's nftables.service flushes the ruleset on restart and reload: this drop-in loads
# sparkfleet's table again after it.
NFTABLES_DROPIN = "/etc/systemd/system/nftables.service.d/50-sparkfleet.conf"
NFT = "/usr/sbin/nft"


def rules_path(node) -> str:
    return f"{node.serving_dir}/firewall.nft"


def unit_text(node) -> str:
    return render("firewall", UNIT_PATH, path=rules_path(node))


def nftables_dropin_text(node) -> str:
    return render("firewall", NFTABLES_DROPIN, path=rules_path(node))


def table_problems(node, live: str, want: str) -> list[str]:
    """The doctor's firewall row: the live table inet sparkfleet is there and is the one data renders
    (`live`: LiveMarker, `want`: `sparkfleet <digest>`)."""
    if not node.firewall_enabled:
        return []
    if not live:
        return [f"{node.name}: the nftables table {TABLE} is missing (`nft flush ruleset`, or removed by hand): the "
                f"fabric's services and the API are unfiltered; a deploy puts it back (or systemctl restart {UNIT})"]
    if live != want:
        return [f"{node.name}: the nftables table {TABLE} is not the one data renders (live marker {live!r}, want "
                f"{want!r}): deploy"]
    return []


def monitor_address(fleet) -> str | None:
    """The monitoring node's management address, as validation pinned it on the controller (an IP literal:
    sparkfleet/addresses.py; no node resolves a name for its firewall); None when monitoring is off."""
    name = monitoring_node_name(list(fleet.nodes))
    return None if name is None else fleet.node(name).management_address


def monitor_problem(node, fleet, monitor: str | None) -> str | None:
    """The exporters' rule admits an IPv4 source (the table's `ip saddr`): a monitoring node given an IPv6
    management address is refused."""
    if monitor is not None and not is_ipv4(monitor):
        name = monitoring_node_name(list(fleet.nodes))
        return (f"{node.name}: the monitoring node {name}'s management address {monitor!r} is not an IPv4 address: "
                "the exporters' rule admits an IPv4 address only (key 'monitoring_node'; set its ssh_hostname to "
                "its IPv4 address, or monitoring_enabled = False)")
    return None


def management_problem(node, subnet: str) -> str | None:
    if node.firewall_api_allowed_networks is None and not subnet:
        return (f"{node.name}: the management subnet could not be read (no local address matches the SSH "
                f"session's); set firewall_api_allowed_networks (e.g. [\"192.168.1.0/24\"]) in data. Nothing was "
                f"changed.")
    return None


@dataclass(frozen=True)
class FirewallFacts:
    """What the firewall's verdict reads of one node, in the plan's facts pass: the live table's marker
    and, with firewall_enabled, the management subnet and whether nft is installed (None: not read, the
    firewall is off); beside them, not read of the node, the monitoring node's address pinned on the
    controller (monitor_address)."""
    live: str
    subnet: str | None = None
    monitor: str | None = None
    nft: bool | None = None


def firewall_facts(state) -> dict[str, FirewallFacts]:
    """At prepare time, every node of the group at once, each node's reads one after the other (the
    facts pass's other readers hold channels on the same connection: tools/plan.py
    FACT_READERS_AT_ONCE): the facts, classes and arguments, the firewall step read itself before
    the plan took its verdict, so recorded bundles (sparkfleet/capture.py) answer them."""
    cluster, fleet = cluster_from_state(state), fleet_from_state(state)

    def read(h) -> FirewallFacts:
        node = cluster.node(h.name)
        if not node.firewall_enabled:  # only whether a table is left to remove
            return FirewallFacts(live=h.get_fact(LiveMarker))
        subnet = h.get_fact(ManagementSubnet, address=node.management_address)
        monitor = monitor_address(fleet)  # roles/monitoring's Prometheus (pinned, not read), or None
        return FirewallFacts(live=h.get_fact(LiveMarker), subnet=subnet, monitor=monitor,
                             nft=bool(h.get_fact(Which, command="nft")))

    return per_host(state, read)


def decide(facts: dict[str, FirewallFacts], cluster, fleet=None) -> dict[str, FirewallPlan]:
    """The firewall's verdict per node, a pure function of its facts and the validated config (`fleet`:
    every group, for the monitoring node; the group itself for a pair): its problem (refused at step
    1b), the marker data renders, whether the table is applied, removed, and nftables installed."""
    fleet = fleet if fleet is not None else cluster
    plans = {}
    for name, read in facts.items():
        node = cluster.node(name)
        if not node.firewall_enabled:
            plans[name] = FirewallPlan(enabled=False, live=read.live)
            continue
        plans[name] = FirewallPlan(
            enabled=True, live=read.live, want=wanted_marker_of(cluster, node, read.subnet, read.monitor),
            subnet=read.subnet, monitor=read.monitor, install_nft=not read.nft,
            problem=management_problem(node, read.subnet) or monitor_problem(node, fleet, read.monitor))
    return plans


def refusal(plans: dict[str, FirewallPlan]) -> DeployError | None:
    """The refusal of the nodes whose firewall cannot be rendered (each problem's text as the firewall
    step raised it before the plan took its verdict), or None."""
    problems = [p.problem for _, p in sorted(plans.items()) if p.problem]
    return DeployError("\n".join(problems)) if problems else None


def summary(plans: dict[str, FirewallPlan]) -> str:
    """The plan's firewall line for one group ('' when no node's table changes): 'applied on spark-a,
    spark-b (the live table is not the rendered one)'; read back by tests/e2e/plan_conformance.py."""
    def nodes(test) -> str:
        return ", ".join(name for name, p in sorted(plans.items()) if test(p))

    parts = [(f"applied on {names} ({why})") for names, why in (
        (nodes(lambda p: p.apply and not p.live), "no table live"),
        (nodes(lambda p: p.apply and p.live), "the live table is not the rendered one"),
    ) if names]
    if removed := nodes(lambda p: p.remove):
        parts.append(f"removed on {removed} (firewall_enabled is false)")
    return "; ".join(parts)


__all__ = ["IPv4Network"]
