"""roles/tls: the fleet CA, each certified node's certificate (every node with a listener on the LAN)
and every node's trust bundle, as the run's plan says (roles/tls/checks.py decide, at step 1b): it
decides nothing. Before the API proxy (step 7b2), which serves the certificate and is reloaded when it is
new, and the exporters (step 12b), restarted when their copy of it is.

In order, each operation only where the plan names the node: the fleet CA made on its node (what of it
is missing); a node's certificate issued (a new key and CSR on the node, signed on the CA node over its
own connection, installed on the node); on the router node the router hop's client certificate issued
the same way into its own root-only file (smg restarts for it at step 12; nothing copies it); a site's
certificate put in the node's PEM; the exporters' copy
of the PEM (root:prometheus 0640; the group made at step 3a); the trust bundle written (and Prometheus'
copy on the monitoring node). An unchanged re-deploy declares none of them.
"""
from pyinfra import host, logger, state
from pyinfra.operations import python, server

from roles.tls.checks import assemble_command, create_ca, exporter_pem_command, issue_certificate, write_bundle
from sparkfleet.decided import fleet_decision
from sparkfleet.inventory import fleet_from_state
from sparkfleet.model.monitoring import monitoring_node_name
from sparkfleet.model.tls import EXPORTER_PEM, ca_bundle_path, client_cert_path

plan = fleet_decision(state).tls
fleet = fleet_from_state(state)
node = fleet.node(host.name)

if plan is not None and plan.enabled:
    if plan.create_ca and host.name == plan.ca_node:
        python.call(name=f"Create the fleet CA on {host.name}", function=create_ca, days=node.tls_ca_days)
    if host.name in plan.issue:
        logger.info(f"--> sparkfleet TLS: {host.name}: a new certificate ({'; '.join(plan.issue[host.name])})")
        python.call(name=f"Issue the certificate of {host.name} from the fleet CA on {plan.ca_node}",
                    function=issue_certificate, ca_name=plan.ca_node, days=node.tls_cert_days)
    if host.name in plan.hop:
        logger.info(f"--> sparkfleet TLS: {host.name}: a new router hop's client certificate "
                    f"({'; '.join(plan.hop[host.name])})")
        python.call(name=f"Issue the router hop's client certificate on {host.name} ({client_cert_path(node)}) from "
                         f"the fleet CA on {plan.ca_node}",
                    function=issue_certificate, ca_name=plan.ca_node, days=node.tls_cert_days, hop=True)
    if host.name in plan.assemble:
        server.shell(name=f"Install the site certificate of {host.name} for its listeners ({plan.assemble[host.name]})",
                     commands=[assemble_command(node)])
    if host.name in plan.exporter_pem:
        server.shell(name=f"Copy the certificate of {host.name} for its exporters into {EXPORTER_PEM} "
                          f"({plan.exporter_pem[host.name]})", commands=[exporter_pem_command(node)])
    if host.name in plan.bundle:
        python.call(name=f"Write the trust bundle {ca_bundle_path(node)} ({plan.bundle[host.name]})",
                    function=write_bundle, ca_name=plan.ca_node, site_cas=plan.site_cas,
                    scrape_ca=host.name == monitoring_node_name(list(fleet.nodes)))
