"""roles/tls: the fleet CA, each head's API certificate and every node's trust bundle, as the run's plan
says (roles/tls/checks.py decide, at step 1b): it decides nothing. Before the API proxy (step 7b2),
which serves the certificate and is reloaded when it is new.

In order, each operation only where the plan names the node: the fleet CA made on its node (what of it
is missing); a head's certificate issued (a new key and CSR on the head, signed on the CA node over its
own connection, installed on the head); a site's certificate put in the proxy's PEM; the trust bundle
written. An unchanged re-deploy declares none of them.
"""
from pyinfra import host, logger, state
from pyinfra.operations import python, server

from roles.tls.checks import assemble_command, create_ca, issue_certificate, write_bundle
from sparkfleet.decided import fleet_decision
from sparkfleet.inventory import fleet_from_state
from sparkfleet.model.tls import ca_bundle_path

plan = fleet_decision(state).tls
node = fleet_from_state(state).node(host.name)

if plan is not None and plan.enabled:
    if plan.create_ca and host.name == plan.ca_node:
        python.call(name=f"Create the fleet CA on {host.name}", function=create_ca, days=node.tls_ca_days)
    if host.name in plan.issue:
        logger.info(f"--> sparkfleet TLS: {host.name}: a new API certificate ({'; '.join(plan.issue[host.name])})")
        python.call(name=f"Issue the API certificate of {host.name} from the fleet CA on {plan.ca_node}",
                    function=issue_certificate, ca_name=plan.ca_node, days=node.tls_cert_days)
    if host.name in plan.assemble:
        server.shell(name=f"Install the site certificate of {host.name} for the API proxy ({plan.assemble[host.name]})",
                     commands=[assemble_command(node)])
    if host.name in plan.bundle:
        python.call(name=f"Write the trust bundle {ca_bundle_path(node)} ({plan.bundle[host.name]})",
                    function=write_bundle, ca_name=plan.ca_node, site_cas=plan.site_cas)
