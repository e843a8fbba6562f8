"""roles/monitoring, first part (step 3a): the user Prometheus, Alertmanager and the node exporter run as,
when it is absent, before anything names it:
- on the monitoring node, the firewall, whose output chain names it (sparkfleet/firewall_rules.py
  MONITORING_USERS): nft resolves a user's name when it loads the rules and refuses a name that does not
  exist;
- on every node whose exporters speak TLS, roles/tls (step 7b1), which gives the exporters' copy of the
  node's certificate and key to its group (sparkfleet/model/tls.py EXPORTER_PEM).
The packages that would make this user are installed at step 4c (roles/monitoring/install_tasks.py). Made with the packages' own postinst line (sparkfleet/model/monitoring.py PROMETHEUS_ADDUSER), so their
postinst finds the user it would have made and keeps it. Without either, the packages make it as before."""
from pyinfra import host, state
from pyinfra.operations import server

from roles.monitoring.checks import UserPresent, monitoring_node
from sparkfleet.inventory import fleet_from_state
from sparkfleet.model.monitoring import PROMETHEUS_ADDUSER, PROMETHEUS_USER
from sparkfleet.model.tls import exporter_tls

fleet = fleet_from_state(state)
node = fleet.node(host.name)
monitor = monitoring_node(fleet)

names = [] if monitor is None else (
    ["the firewall"] * (monitor.name == node.name and node.firewall_enabled)
    + ["the exporters' certificate"] * exporter_tls(node))
if names and not host.get_fact(UserPresent, user=PROMETHEUS_USER):
    server.shell(name=f"Create the user {PROMETHEUS_USER} ({' and '.join(names)} name{'s' * (len(names) == 1)} it; "
                      f"its packages keep it)", commands=[PROMETHEUS_ADDUSER])
