"""One serving group's turn (deploy.py includes this once per group, in turn order, on every host).

Every host defines the turn's first operation, whatever its group: a host's operations are a chain
pyinfra keeps in order, so no operation of this turn runs before every operation of the previous
turn (each host's chain has the previous turn's steps, or its barrier, before this one). Only the
hosts of the turn's group define its steps; with one group (a pair) it is today's run, plus one
skipped operation.
"""

from pyinfra import host, local, state
from pyinfra.operations import python

from roles.kernel_cache.checks import request_command
from roles.rolling.checks import drain, previous_came_back, prove_and_undrain, router_for, turn_groups, turn_order
from roles.serving.api_key import curl_config
from sparkfleet.model.serving import node_profile
from sparkfleet.decided import decisions, fleet_summary
from sparkfleet.inventory import cluster_from_state

turn = host.current_deploy_data["sparkfleet_turn"]  # 'g1', or 'g1+g2' when none serves yet
order = turn_order(state)
cluster = cluster_from_state(state)  # this host's own group
node = cluster.node(host.name)
mine = node.serving_group in turn_groups(turn)
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
    restart = decisions(state).serving.restart  # the group's plan (tools/plan.py): it stops and starts
    group = node.serving_group
    routed = router_for(state, group)
    router, url = routed if routed else (None, None)
    timeout_s = float(node.serving_health_timeout_s)

    python.call(
        name=f"Take serving group {group} out of the router (it restarts)",
        function=drain,
        group=group,
        router=router.name if router else None,
        url=url,
        timeout_s=timeout_s,
        _if=lambda: node.is_head and restart and router is not None,
    )

    # 7c. The watchdog paused (head first) when the prewarm or the group's restart will stop units.
    local.include("roles/watchdog/pause_tasks.py")

    # 8. Kernel caches per image: warmed before production, the union on every rank, manifests equal.
    local.include("roles/kernel_cache/tasks.py")

    # 9. The units: --headless workers first, then the head; /health awaited, endpoint printed.
    local.include("roles/serving/tasks.py")

    # 10. The watchdog: installed, configured, started again where paused or stopped (workers first).
    local.include("roles/watchdog/tasks.py")

    # 11. The benchmark receipt, when the group (re)started: a short fixed load through the API.
    local.include("roles/receipt/tasks.py")

    profile = node_profile(node)
    body = {"model": profile.api_model_name, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    # A real request (both ranks answer it), its HTTP code checked; the key from curl's root-only config.
    probe = f"code=$({request_command(profile.port, body, curl_config(node))} 2>/dev/null); " \
            f"test \"$code\" = 200 && echo \"chat completion 200\" || {{ echo \"chat completion answered $code\"; false; }}"
    python.call(
        name=f"Prove serving group {group} serves, and put it back in the router",
        function=prove_and_undrain,
        group=group,
        probe=probe,
        router=router.name if router else None,
        url=url,
        timeout_s=timeout_s,
        _if=lambda: node.is_head and restart,
    )
