"""One serving group at a time: the order of the turns and what each turn does at its ends.

deploy.py runs steps 7c-11 (watchdog pause, kernel caches, units, watchdog, receipt) once per
serving group, in turn order (turn_order). A host's operations are a chain that pyinfra keeps in
order, and every host defines the barrier operation of every turn (roles/rolling/turn_start.py), so all
of one group's operations run before the next group's first: with a router in front, a group
being upgraded is out of routing while the others serve. A turn ends by proving the group serves
(a real chat completion through both ranks) and putting it back; a group that does not come back
fails its head, and the run stops there (config.FAIL_PERCENT = 0): the next group is never
stopped, and the endpoint keeps answering from the groups that serve.
"""
from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.rolling.routes import Backend, routing_plan
from roles.router import control
from roles.router.control import groups_by_url
from roles.router.facts import RouterRouting
from roles.router.node_config import ROUTER_UNIT, backend_url, routed_groups, router_node, served_name
from sparkfleet.decided import fleet_summary
from sparkfleet.inventory import cluster_from_state, fleet_from_state
from sparkfleet.once import once_per_fleet
from sparkfleet.plan_types import turn_sequence
from sparkfleet.refusal import Problem, Refusal


def turn_order(state) -> list[str]:
    """The turns, in order, each the groups that take it ('g1', or 'g1+g2'): one group per turn while
    any group serves (the others keep answering during a group's turn), the groups that do not
    serve first (sparkfleet/plan_types.py turn_sequence); all groups in one turn when none serves yet (a
    first bring-up keeps nobody waiting for nothing)."""
    groups = list(fleet_from_state(state).groups)
    plans = fleet_summary(state)
    if any(p.healthy for p in plans.values()):
        planned = turn_sequence(plans)
        return planned + [g for g in groups if g not in planned]
    return ["+".join(groups)]


def turn_groups(turn: str) -> list[str]:
    return turn.split("+")


def takes_turn(state, turn: str) -> bool:
    """Whether the host pyinfra is working on is of a group that takes `turn` (deploy.py: only those
    hosts define the turn's steps)."""
    return cluster_from_state(state).node(host.name).serving_group in turn_groups(turn)


def router_for(state, group: str):
    """(router node, the group head's backend URL) when a router routes to `group`, else None."""
    fleet = fleet_from_state(state)
    router = router_node(fleet)
    if router is None or group not in routed_groups(fleet, router):
        return None
    return router, backend_url(fleet.groups[group].head)


def router_active(state, router_name: str) -> bool:

    host = state.inventory.get_host(router_name)
    ok, out = host.run_shell_command(StringCommand(f"systemctl is-active {ROUTER_UNIT}.service"))
    return out.stdout.strip() == "active"


def _at_router(group: str, router: str, url: str, timeout_s: float, back: bool) -> None:
    """The group out of routing (back=False) or back in (True), at the router on `router`."""


    if not router_active(state, router):
        logger.info(f"    serving group {group}: the router on {router} is not running; nothing to "
                    f"{'put back' if back else 'drain'}")
        return
    try:
        (control.undrain if back else control.drain)(state.inventory.get_host(router), url, timeout_s)
    except control.RouterError as e:
        raise DeployError(f"serving group {group} serves but is not routed again: {e}; the next group is not started"
                          if back else f"serving group {group} could not be taken out of routing: {e}; nothing was "
                          f"stopped")
    logger.info(f"    serving group {group}: routed again at {router} ({url})" if back else
                f"    serving group {group}: out of routing at {router} ({url}); the other groups serve")


def drain(group: str, router: str, url: str, timeout_s: float) -> None:
    """Operation body (the group's head): take the group out of routing before it stops; in-flight
    requests finish first (the router drains before it removes)."""
    _at_router(group, router, url, timeout_s, back=False)


def prove_and_undrain(group: str, probe: str, router: str | None, url: str | None, timeout_s: float) -> None:
    """Operation body (the group's head): a real chat completion through both ranks, then the group
    back in routing (the router's own health checks pass: undrain returns once it routes to it)."""
    ok, out = host.run_shell_command(StringCommand(probe), _timeout=timeout_s)
    if not ok:
        raise DeployError(
            f"{host.name}: serving group {group} did not come back: {(out.stdout or out.stderr).strip()}; the next "
            f"group is not started (the endpoint keeps serving from the groups that are up)")
    logger.info(f"    [{host.name}] serving group {group} serves: {out.stdout.strip()}")
    if router is not None:
        _at_router(group, router, url, timeout_s, back=True)


def previous_came_back(group: str, earlier: list[str]) -> None:
    """Operation body (the group's head, before its turn): no host of an earlier group failed."""
    fleet = fleet_from_state(state)
    failed = sorted(h.name for h in state.failed_hosts
                    if (n := fleet.find(h.name)) is not None and n.serving_group in earlier)
    if failed:
        raise DeployError(f"serving group {group} is not started: {', '.join(failed)} of an earlier group did not come "
                          f"back")


def turns_done(order: list[str]) -> None:
    """Operation body (one host): the order the groups took their turns in, for the operator."""


    plans = fleet_summary(state)
    moved = [t for t in order if any(plans[g].restart for g in turn_groups(t) if g in plans)]
    how = "restarted one at a time" if len(order) > 1 else "restarted together (none was serving)"
    logger.info(f"    serving groups took their turns in this order: {', '.join(order)}; {how}: "
                f"{', '.join(moved) or 'none'}")


def routing_decision(state):
    """The run's routing plan (roles/rolling/routes.py), once per run, from the router's routing read
    at prepare and every group's plan; printed, and a drain of a model's last routed group refused
    here, before any change. None when there is no router, or it is not running or not answering."""


    def compute():
        fleet = fleet_from_state(state)
        router = router_node(fleet)
        if router is None:
            return None
        table = state.inventory.get_host(router.name).get_fact(RouterRouting)
        if table is None or "error" in table:
            logger.info(f"--> sparkfleet router on {router.name}: "
                        + ("not running; it starts with every group (step 12)" if table is None
                           else f"not answering ({table['error']}); routing is not checked before the turns"))
            return None
        plans = fleet_summary(state)
        backends = [Backend(name, url, served_name(fleet.groups[name]), table.get(url), plans[name].healthy,
                            plans[name].restart)
                    for url, name in groups_by_url(fleet, router).items() if name in plans]
        plan = routing_plan(backends, [turn_groups(t) for t in turn_order(state)], router.router_outage_accepted)
        for line in plan.lines(backends, router.name):
            logger.info(line)
        if plan.last_routed:
            raise Refusal(
                "a turn would take the last routed group of a model out of the router; nothing was changed",
                [Problem(why, [fleet.groups[group].head.name], key="router_outage_accepted",
                         fix="bring another group of that model back first (a deploy repairs the groups that do not "
                             "serve before it drains one that does), or set router_outage_accepted: true (allowed: "
                             "true, false) to accept the outage")
                 for group, why in plan.last_routed.items()])
        return plan

    return once_per_fleet(state, "routing", compute)


def route_again(groups: list[tuple[str, str]], timeout_s: float) -> None:
    """Operation body (the router node, before any turn): put back the groups an earlier run left
    drained (group, backend URL); each returns once the router routes to it (its health checks pass)."""


    for group, url in groups:
        try:
            control.undrain(host, url, timeout_s)
        except control.RouterError as e:
            raise DeployError(f"serving group {group} serves but could not be routed again: {e}; no turn was started")
        logger.info(f"    serving group {group}: routed again at {host.name} ({url}); an earlier run had left it "
                    f"drained")
