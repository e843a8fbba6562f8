"""One serving group at a time: what each turn does at its ends, in the order the plan decided.

deploy.py runs steps 7c-11 (watchdog pause, kernel caches, units, watchdog, receipt) once per
serving group, in the turn order the plan took at step 1b (tools/plan.py, sparkfleet/plan_types.py
turn_order; read here from sparkfleet/decided.py FleetDecision), as are the drains and the groups
routed again (roles/rolling/routes.py decide, at step 1b too): nothing here decides either again.
A host's operations are a chain that pyinfra keeps in order, and every host defines the barrier
operation of every turn (roles/rolling/turn_start.py), so all of one group's operations run before
the next group's first: with a router in front, a group
being upgraded is out of routing while the others serve. A turn ends by proving the group serves
(a real chat completion through both ranks) and putting it back; a group that does not come back
fails its head, and the run stops there (config.FAIL_PERCENT = 0): the next group is never
stopped, and the endpoint keeps answering from the groups that serve.
"""
from __future__ import annotations

from pyinfra import host, logger, state
from pyinfra.api import StringCommand
from pyinfra.api.exceptions import DeployError

from roles.router import control
from roles.router.node_config import ROUTER_UNIT, backend_url, router_node
from sparkfleet.decided import fleet_decision, fleet_summary
from sparkfleet.inventory import cluster_from_state, fleet_from_state
from sparkfleet.plan_types import turn_groups

__all__ = ["turn_groups"]


def turn_order(state) -> list[str]:
    """The turns, in order, as the plan decided them (sparkfleet/plan_types.py turn_order), each the
    groups that take it ('g1', or 'g1+g2' when none serves yet)."""
    return list(fleet_decision(state).summary.turns)


def takes_turn(state, turn: str) -> bool:
    """Whether the host pyinfra is working on is of a group that takes `turn` (deploy.py: only those
    hosts define the turn's steps)."""
    return cluster_from_state(state).node(host.name).serving_group in turn_groups(turn)


def drained_at(state, group: str):
    """(router node, the group head's backend URL) when the plan takes `group` out of routing for its
    restart (and routes it again at its turn's end), else None."""
    if not fleet_decision(state).drains(group):
        return None
    fleet = fleet_from_state(state)
    return router_node(fleet), backend_url(fleet.groups[group].head)


def router_active(state, router_name: str) -> bool:
    """A local gate at a turn's ends, not a verdict: the router's unit was active at prepare (the plan
    drains through it only then), and is asked again here, as it may have stopped since."""

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
