"""The run's one plan, as tools/plan.py decided it (deploy.py step 1b), before any operation: each
role reads its group's slice here and decides nothing again. What a deploy does is what this says.

Each verdict's type is its role's own (roles/<role>/checks.py); this module only holds them, so it
imports no role: the ground floor (sparkfleet/) stands under every role, and the composer above them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkfleet.inventory import current_group
from sparkfleet.plan_types import GroupPlan

_KEY = "_sparkfleet_decisions"


@dataclass(frozen=True)
class Decisions:
    """One serving group's verdicts, each taken once from prepare-time facts."""
    summary: GroupPlan  # what the plan table prints and `sparkfleet plan` reads
    fabric: Any         # roles/fabric/checks.py FabricState: each node's drift, and whether it is applied again
    key: str            # roles/serving/api_key.py decide_key: "ok", or why the head's key files are written
    image: Any          # roles/image/checks.py ImagePlan: build on the head, ship to which workers
    weights: Any        # roles/weights/checks.py WeightsPlan: fetched on the head, pulled by which nodes
    caches: Any         # roles/kernel_cache/checks.py CachePlan: prewarm, or sync/link/expire
    speed: Any          # roles/fabric_speed/checks.py SpeedPlan: whether and why the fabric proves its speed
    serving: Any        # roles/serving/checks.py PairState, its restart the composition of every verdict
    watchdog: Any       # roles/watchdog/checks.py WatchdogPlan: paused around what moves the pair


class NotDecided(RuntimeError):
    """A step read the plan before deploy.py's step 1b decided it."""


def install(state, decisions: dict[str, Decisions]) -> None:
    """The composer's (tools/plan.py) one write: every group's decisions, for the run."""
    setattr(state, _KEY, dict(decisions))


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
