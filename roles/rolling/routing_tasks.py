"""Before the turns (deploy.py): routing converges to the plan (roles/rolling/routes.py, decided at
step 1b from the router's routing read in the facts pass). A healthy group an earlier run left
drained is routed again here, on the router node, before any group is drained; a turn that would
drain a model's last routed group was refused at step 1b. Nothing runs when every group is routed."""
from pyinfra import host, state
from pyinfra.operations import python

from roles.rolling.checks import route_again
from roles.router.node_config import backend_url
from sparkfleet.decided import fleet_decision
from sparkfleet.inventory import fleet_from_state

fleet = fleet_from_state(state)
planned = fleet_decision(state).summary
groups = [(g, backend_url(fleet.groups[g].head)) for g in planned.route_again]

python.call(
    name=f"Route again the serving groups an earlier run left drained ({', '.join(g for g, _ in groups) or 'none'})",
    function=route_again,
    groups=groups,
    timeout_s=120.0,
    _if=lambda: bool(groups) and host.name == planned.router,
)
