"""Routing converges to the plan, every run: pure decisions from the router's routing, read in the
facts pass at prepare (roles/router/facts.py RouterRouting, tools/plan.py fleet_facts), each group's
plan and the turn order, taken once at step 1b with the groups' (tools/plan.py decide).

- Route again: a group the router has drained (out of its registry) whose plan says it serves,
  healthy, and does not restart in this run is put back before any turn. Draining and routing
  again are the two ends of a turn (roles/rolling/turn_start.py, turn_end.py); a run that stopped between them (a
  receipt, the KV check, a prewarm that failed and brought the previous production back) left
  the group drained, and the next run, finding it unchanged, would never have routed it again.
- The last routed group: a turn never takes the last routed group of a model out of the router.
  The turns are walked in order as the run will take them: a group routed at its drain counts for
  the others; a group whose turn ended is routed (its turn ends by routing it again, or the run
  stops). A drain that would leave a model with no routed group is refused before any change,
  unless router_outage_accepted says the outage is accepted (the composer refuses it, before any
  host is changed).
- Drained for a restart: a group the router routes whose plan restarts it is taken out of routing
  at its turn's start and put back at its end (when the router's unit was active at prepare).
A router that is not running (a first deploy, or router_node just set) routes nothing: neither
applies, and the router starts at step 12 with every group of its config.
"""
from __future__ import annotations

from roles.router.control import groups_by_url
from roles.router.node_config import router_node, served_name
from sparkfleet.plan_types import turn_groups
from sparkfleet.refusal import Problem, Refusal
from sparkfleet.verdicts import Backend, RoutingPlan

__all__ = ["Backend", "RoutingPlan", "decide", "refusal", "routing_plan"]


def decide(fleet, table, plans, turns: list[str]) -> RoutingPlan:
    """The run's routing verdict, a pure function of the router's routing read at prepare (`table`:
    RouterRouting's value), every group's plan (GroupPlan) and the turn order."""
    router = router_node(fleet)
    if router is None:
        return RoutingPlan()
    if table is None:
        return RoutingPlan(router=router.name, note="not running; it starts with every group (step 12)")
    backends = [Backend(name, url, served_name(fleet.groups[name]), table.get(url), plans[name].healthy,
                        plans[name].restart)
                for url, name in groups_by_url(fleet, router).items() if name in plans]
    restarting = {b.group for b in backends if b.restart}
    drain = tuple(g for t in turns for g in turn_groups(t) if g in restarting)
    if "error" in table:  # its unit is active: the turns drain through it (and stop if it still does not answer)
        return RoutingPlan(router=router.name, drain=drain,
                           note=f"not answering ({table['error']}); routing is not checked before the turns")
    found = routing_plan(backends, [turn_groups(t) for t in turns], router.router_outage_accepted)
    return RoutingPlan(router=router.name, states={b.group: b.state for b in backends}, route_again=found.route_again,
                       drain=drain, last_routed=found.last_routed, accepted=found.accepted)


def refusal(fleet, plan: RoutingPlan) -> Refusal | None:
    """The refusal of a turn that would drain the last routed group of a model (None: no such turn)."""
    if not plan.last_routed:
        return None
    return Refusal(
        "a turn would take the last routed group of a model out of the router; nothing was changed",
        [Problem(why, [fleet.groups[group].head.name], key="router_outage_accepted",
                 fix="bring another group of that model back first (a deploy repairs the groups that do not "
                     "serve before it drains one that does), or set router_outage_accepted: true (allowed: "
                     "true, false) to accept the outage")
         for group, why in plan.last_routed.items()])


def routing_plan(backends: list[Backend], turns: list[list[str]], outage_accepted: bool) -> RoutingPlan:
    """What is routed again before any turn, and which turn's drain would leave a model unrouted."""
    route_again, last_routed, accepted = [], {}, {}
    routed = {}
    for b in backends:
        again = b.state == "drained" and b.healthy and not b.restart
        if again:
            route_again.append(b.group)
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
                (accepted if outage_accepted else last_routed)[group] = why
        for group in turn:
            if group in by_group and by_group[group].restart:
                routed[group] = True  # its turn ends routed, or the run stops there
    return RoutingPlan(route_again=tuple(route_again), last_routed=last_routed, accepted=accepted)
