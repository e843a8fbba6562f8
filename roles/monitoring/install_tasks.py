"""roles/monitoring, second part (step 4c, after the fetch's start): the monitoring packages a node runs,
installed in one apt transaction while the head's image builds (roles/image/build_start_tasks.py, step
2d) and its weights are fetched, so step 12b, after the pair serves, only writes files and starts services:
- every node: `prometheus-node-exporter`; the monitoring node: `prometheus`, and `prometheus-alertmanager`
  with monitoring_alertmanager_enabled; each the OS's build of its pinned upstream version, installed
  when another or none is (the versions read at prepare: InstalledVersions);
- their services held from starting (roles/monitoring/checks.py HELD_POLICY): nothing of them listens or
  scrapes before step 12b has written sparkfleet's arguments, TLS and config, and step 12b starts (or, an
  upgrade, restarts) each one this step installed. A deploy that stops in between leaves the packages
  installed and their services stopped; the next run's step 12b starts them."""
from pyinfra import host, state
from pyinfra.operations import server

from roles.monitoring.checks import PACKAGES, InstalledVersions, held_packages, install_command, monitoring_node, to_install
from sparkfleet.inventory import fleet_from_state

fleet = fleet_from_state(state)
node = fleet.node(host.name)
monitor = monitoring_node(fleet)

if monitor is not None:
    install = to_install(held_packages(node, monitor), host.get_fact(InstalledVersions, packages=PACKAGES))
    if install:
        server.shell(name=f"Install {', '.join(f'{p} {v}' for p, v in install.items())} (the OS's build"
                          f"{'s' * (len(install) > 1)}; held from starting until step 12b)",
                     commands=[install_command(install)])
