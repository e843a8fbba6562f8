"""Before the turns (deploy.py): routing converges to the plan (roles/rolling/routes.py). The
router's routing was read at prepare; a healthy group an earlier run left drained is routed again
here, on the router node, before any group is drained; a turn that would drain a model's last
routed group was refused at prepare (routing_decision). Nothing runs when every group is routed."""
from pyinfra import host, state
from pyinfra.operations import python

from roles.rolling.checks import route_again, routing_decision
from roles.router.node_config import backend_url, router_node
from sparkfleet.inventory import fleet_from_state

fleet = fleet_from_state(state)
router = router_node(fleet)
decision = routing_decision(state)
groups = [(g, backend_url(fleet.groups[g].head)) for g in (decision.route_again if decision else [])]

python.call(
    name=f"Route again the serving groups an earlier run left drained ({', '.join(g for g, _ in groups) or 'none'})",
    function=route_again,
    groups=groups,
    timeout_s=120.0,
    _if=lambda: bool(groups) and router is not None and host.name == router.name,
)
