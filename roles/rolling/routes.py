"""Routing converges to the plan, every run: pure decisions from the router's routing, read at
prepare (roles/router/facts.py RouterRouting), and each group's plan (tools/plan.py).

- Route again: a group the router has drained (out of its registry) whose plan says it serves,
  healthy, and does not restart in this run is put back before any turn. Draining and routing
  again are the two ends of a turn (roles/rolling/turn_start.py, turn_end.py); a run that stopped between them (a
  receipt, the KV check, a prewarm that failed and brought the previous production back) left
  the group drained, and the next run, finding it unchanged, would never have routed it again.
- The last routed group: a turn never takes the last routed group of a model out of the router.
  The turns are walked in order as the run will take them: a group routed at its drain counts for
  the others; a group whose turn ended is routed (its turn ends by routing it again, or the run
  stops). A drain that would leave a model with no routed group is refused before any change,
  unless router_outage_accepted says the outage is accepted.
A router that is not running (a first deploy, or router_node just set) routes nothing: neither
applies, and the router starts at step 12 with every group of its config.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backend:
    """One serving group as the router sees it, and as this run's plan has it."""

    group: str
    url: str
    model: str
    state: str | None  # routed | unhealthy | draining | drained; None: not in the router's config yet
    healthy: bool  # its plan's probe: it serves
    restart: bool  # its plan restarts it (a turn that drains it, when it is routed)


@dataclass
class RoutingPlan:
    route_again: list[str] = field(default_factory=list)  # groups put back before any turn
    last_routed: dict[str, str] = field(default_factory=dict)  # group -> why its drain is refused
    accepted: dict[str, str] = field(default_factory=dict)  # the same, with the outage accepted in data

    def lines(self, backends: list[Backend], router: str) -> list[str]:
        cells = ", ".join(f"{b.group} {b.state or 'not configured yet'}" for b in backends)
        out = [f"--> sparkfleet router on {router}: {cells}"]
        if self.route_again:
            out.append(f"    routed again before any turn (an earlier run left them drained; they serve): "
                       f"{', '.join(self.route_again)}")
        for group, why in self.accepted.items():
            out.append(f"    {group}: {why}; router_outage_accepted is true: its turn drains it anyway")
        return out


def routing_plan(backends: list[Backend], turns: list[list[str]], outage_accepted: bool) -> RoutingPlan:
    plan = RoutingPlan()
    routed = {}
    for b in backends:
        again = b.state == "drained" and b.healthy and not b.restart
        if again:
            plan.route_again.append(b.group)
        routed[b.group] = b.state == "routed" or again
    by_group = {b.group: b for b in backends}
    for turn in turns:
        for group in turn:
            b = by_group.get(group)
            if b is None or not b.restart or not routed[group]:
                continue  # not in the router, not drained by this run, or already out: no routing is lost
            others = [o for o in backends if o.model == b.model and o.group not in turn]
            if not any(routed[o.group] for o in others):
                states = ", ".join(f"{o.group}: {o.state or 'not configured yet'}"
                                   + (" (restarts in a later turn)" if o.restart else "") for o in others)
                why = (f"serving group {group} is the last group the router routes for model {b.model!r}"
                       + (f" ({states})" if states else " (the only group serving it)")
                       + f"; draining it for its restart leaves the fleet's endpoint serving nothing for a whole "
                       f"cold start")
                (plan.accepted if outage_accepted else plan.last_routed)[group] = why
        for group in turn:
            if group in by_group and by_group[group].restart:
                routed[group] = True  # its turn ends routed, or the run stops there
    return plan
