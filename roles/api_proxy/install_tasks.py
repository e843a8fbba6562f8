"""roles/api_proxy, first part: HAProxy from the distribution on each head and on the router node (the
router's gate, roles/router/gate.py), before the firewall, whose output rules name HAProxy's user
(sparkfleet/firewall_rules.py ENGINE_PORT_USERS); the rest of the role (roles/api_proxy/tasks.py) runs
once the API key's files exist, the router's gate with roles/router at step 12."""
from pyinfra import host, state
from pyinfra.operations import apt

from roles.api_proxy.checks import PACKAGE, UNIT_PATH, ApiProxyHost
from sparkfleet.inventory import cluster_from_state

node = cluster_from_state(state).node(host.name)
gate = node.router_node == node.name  # the router's gate runs HAProxy too
if (node.is_head or gate) and not host.get_fact(ApiProxyHost, unit_path=UNIT_PATH)["haproxy"]:
    apt.packages(name=f"Install haproxy (the {'API proxy' if node.is_head else 'router gate'})", packages=[PACKAGE],
                 update=True, cache_time=3600)
