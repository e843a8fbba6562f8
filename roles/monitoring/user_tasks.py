"""roles/monitoring, first part: on the monitoring node, the user Prometheus and Alertmanager run as,
before the firewall, whose output chain names it (sparkfleet/firewall_rules.py MONITORING_USERS): nft
resolves a user's name when it loads the rules and refuses a name that does not exist, and the
packages that make this user are installed only at step 12b (roles/monitoring/tasks.py), after the
firewall. Made with the packages' own postinst line (sparkfleet/model/monitoring.py
PROMETHEUS_ADDUSER), so their postinst finds the user it would have made and keeps it. Without the
firewall nothing names it, and the packages make it as before."""
from pyinfra import host, state
from pyinfra.operations import server

from roles.monitoring.checks import UserPresent, monitoring_node
from sparkfleet.inventory import fleet_from_state
from sparkfleet.model.monitoring import PROMETHEUS_ADDUSER, PROMETHEUS_USER

fleet = fleet_from_state(state)
node = fleet.node(host.name)
monitor = monitoring_node(fleet)

if (monitor is not None and monitor.name == node.name and node.firewall_enabled
        and not host.get_fact(UserPresent, user=PROMETHEUS_USER)):
    server.shell(name=f"Create the user {PROMETHEUS_USER} (the firewall names it; its packages keep it)",
                 commands=[PROMETHEUS_ADDUSER])
