"""roles/api_proxy, first part: HAProxy from the distribution on each head, before the firewall,
whose output rule names HAProxy's user (sparkfleet/firewall_rules.py ENGINE_PORT_USERS); the rest of
the role (roles/api_proxy/tasks.py) runs once the API key's files exist."""
from pyinfra import host, state
from pyinfra.operations import apt

from roles.api_proxy.checks import PACKAGE, UNIT_PATH, ApiProxyHost
from sparkfleet.inventory import cluster_from_state

node = cluster_from_state(state).node(host.name)
if node.is_head and not host.get_fact(ApiProxyHost, unit_path=UNIT_PATH)["haproxy"]:
    apt.packages(name="Install haproxy (the API proxy)", packages=[PACKAGE], update=True, cache_time=3600)
