"""The start of one serving group's turn (deploy.py includes it once per turn, in turn order, on
every host; the turn's steps 7c-11 follow it in deploy.py, on the hosts of the turn's group only).

Every host defines the turn's first operation, whatever its group: a host's operations are a chain
pyinfra keeps in order, so no operation of this turn runs before every operation of the previous
turn (each host's chain has the previous turn's steps, or its barrier, before this one). With one
group (a pair) it is today's run, plus one skipped operation. Then, when the group restarts behind a
router, it is taken out of routing (roles/rolling/turn_end.py puts it back).
"""
from pyinfra import host, state
from pyinfra.operations import python

from roles.rolling.checks import drain, drained_at, previous_came_back, takes_turn, turn_groups, turn_order
from sparkfleet.decided import fleet_summary
from sparkfleet.inventory import cluster_from_state

turn = host.current_deploy_data["sparkfleet_turn"]  # 'g1', or 'g1+g2' when none serves yet
order = turn_order(state)
node = cluster_from_state(state).node(host.name)  # this host's own group
mine = takes_turn(state, turn)
earlier = [g for t in order[:order.index(turn)] for g in turn_groups(t)]
plans = fleet_summary(state)  # every group's verdicts (tools/plan.py), printed before any change
earlier_moved = any(plans[g].restart for g in earlier if g in plans)

python.call(
    name=f"Serving group {turn}: the groups before it came back",
    function=previous_came_back,
    group=turn,
    earlier=earlier,
    _if=lambda: mine and node.is_head and earlier_moved,
)

if mine:
    group = node.serving_group
    drained = drained_at(state, group)  # the plan's: it restarts, and the router routes it (step 1b)
    router, url = drained if drained else (None, None)
    python.call(
        name=f"Take serving group {group} out of the router (it restarts)",
        function=drain,
        group=group,
        router=router.name if router else None,
        url=url,
        timeout_s=float(node.serving_health_timeout_s),
        _if=lambda: node.is_head and drained is not None,
    )
