"""The run's one plan, as tools/plan.py decided it (deploy.py step 1b), before any operation: each
role reads its group's slice here and decides nothing again. What a deploy does is what this says.

Each verdict's type is on the ground floor (sparkfleet/verdicts.py), as each role's decide() returns
it; this module holds them and imports no role: the ground floor (sparkfleet/) stands under every
role, and the composer (tools/) above them.
"""
from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.inventory import current_group
from sparkfleet.plan_types import FleetPlan, GroupPlan
from sparkfleet.verdicts import (
    CachePlan, FabricState, FirewallPlan, FleetKey, ImagePlan, NodeMemory, PairState, SpeedPlan, TlsPlan, WatchdogPlan,
    WeightsPlan,
)

_KEY = "_sparkfleet_decisions"
_FLEET_KEY = "_sparkfleet_fleet_decision"
_AFTER_BUILD = "_sparkfleet_caches_after_build"


@dataclass(frozen=True)
class Decisions:
    """One serving group's verdicts, each taken once from prepare-time facts (each type frozen:
    sparkfleet/verdicts.py)."""
    summary: GroupPlan  # what the plan table prints and `sparkfleet plan` reads
    fabric: FabricState  # roles/fabric: each node's drift, and whether the link is applied again
    key: str  # roles/serving decide_key: "ok", or why the head's key files are written ("missing", "stale")
    image: ImagePlan  # roles/image: build on the head, ship to which workers
    weights: WeightsPlan  # roles/weights: fetched on the head, pulled by which nodes
    caches: CachePlan  # roles/kernel_cache: prewarm, or sync/link/expire
    speed: SpeedPlan  # roles/fabric_speed: whether and why the fabric proves its speed
    serving: PairState  # roles/serving, its restart the composition of every verdict (tools/plan.py)
    watchdog: WatchdogPlan  # roles/watchdog: paused around what moves the pair
    memory: dict[str, NodeMemory]  # node -> its memory as preflight read it (roles/guards admits against it)
    firewall: dict[str, FirewallPlan]  # node -> roles/firewall: its table applied, removed, nftables installed


@dataclass(frozen=True)
class FleetDecision:
    """The fleet's verdicts, taken at step 1b with the groups' from the same facts pass: the turn
    order, the routing (what is routed again, drained for a restart; a drain of a model's last routed
    group was refused there), the fleet key's fate and TLS (the fleet CA, the nodes' certificates, the
    trust bundles). The rolling, router, key, TLS and API proxy steps read it."""
    summary: FleetPlan  # what the plan prints and `sparkfleet plan` reads
    key: FleetKey | None  # roles/router fleet_key.decide: the key (in memory only) and where it is written
    tls: TlsPlan | None = None  # roles/tls decide: what this run creates, issues and writes

    def key_written_on(self, node: str) -> bool:
        """This run writes the fleet's key into `node`'s key file (a changed key there)."""
        return self.key is not None and node in self.key.writes

    def drains(self, group: str) -> bool:
        """`group` is taken out of routing for its restart, and routed again at its turn's end."""
        return group in self.summary.drain


class NotDecided(RuntimeError):
    """A step read the plan before deploy.py's step 1b decided it."""


def install(state, decisions: dict[str, Decisions], fleet: FleetDecision) -> None:
    """The composer's (tools/plan.py) one write: every group's decisions and the fleet's, for the run."""
    setattr(state, _KEY, dict(decisions))
    setattr(state, _FLEET_KEY, fleet)


def fleet_decision(state) -> FleetDecision:
    """The fleet's decision (turns, routing, the fleet key)."""
    found = getattr(state, _FLEET_KEY, None)
    if found is None:
        raise NotDecided("the fleet's plan is read before it was decided (deploy.py step 1b, tools/plan.py decide)")
    return found


def fleet_decisions(state) -> dict[str, Decisions]:
    """Every serving group's decisions, by group name."""
    decided = getattr(state, _KEY, None)
    if decided is None:
        raise NotDecided("the run's plan is read before it was decided (deploy.py step 1b, tools/plan.py decide)")
    return decided


def decisions(state) -> Decisions:
    """The decisions of the group pyinfra is working on (its greenlet's host)."""
    fleet = fleet_decisions(state)
    group = current_group(state)
    if group is None or group not in fleet:
        raise NotDecided(f"no plan for serving group {group!r} (planned: {', '.join(sorted(fleet)) or 'none'})")
    return fleet[group]


def fleet_summary(state) -> dict[str, GroupPlan]:
    """Every group's plan as the table printed it: group -> GroupPlan."""
    return {name: d.summary for name, d in fleet_decisions(state).items()}


def record_after_build(state, head: str, caches: CachePlan) -> None:
    """roles/kernel_cache's verdict for the group of `head`, taken after the build where the plan left it
    to then (CachePlan.after_build: the same decide() on the facts read once the image exists), for
    the steps after it to read (prewarmed)."""
    state.__dict__.setdefault(_AFTER_BUILD, {})[head] = caches


def prewarmed(state, head: str, planned: CachePlan) -> bool:
    """This run's kernel-cache step prewarms (prewarmed) the group of `head`: its plan says so, or the
    verdict it took after the build does. Read while operations run (an operation's _if)."""
    after = state.__dict__.get(_AFTER_BUILD, {}).get(head)
    return planned.prewarm or (after is not None and after.prewarm)
