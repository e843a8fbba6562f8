"""roles/firewall: the nftables table inet sparkfleet, from data; applied atomically (nft -f, one
transaction) only when the rendered rules differ from the live table; loaded at boot by its unit.
Nothing else on the node is touched; SSH is never filtered by it.

It decides nothing: its node's slice of the plan (sparkfleet/decided.py, roles/firewall/checks.py
decide at step 1b, where a node whose table cannot be rendered was refused) says what the rules are
rendered from, whether nftables is installed, and whether the table is applied or removed."""
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.operations import apt, server, systemd
from pyinfra.operations.util import any_changed

from roles.firewall.checks import NFT, NFTABLES_DROPIN, UNIT, UNIT_PATH, nftables_dropin_text, rules_path, unit_text
from sparkfleet import unchanged
from sparkfleet.decided import decisions
from sparkfleet.firewall_rules import api_networks, rules_text
from sparkfleet.model.firewall import TABLE
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
plan = decisions(state).firewall[host.name]

if plan.enabled:
    if node.is_head:
        logger.info(f"--> sparkfleet firewall: the API on {node.name} from {', '.join(api_networks(node, plan.subnet))}; "
                    f"the fabric's services from the fabric only; SSH not filtered")
    if plan.install_nft:
        apt.packages(name="Install nftables", packages=["nftables"], update=True, cache_time=3600)
    unchanged.directory(name="Create the serving config directory", path=node.serving_dir, user="root", group="root",
                    mode="0700")
    rules = unchanged.put(name=f"Write {rules_path(node)}",
                          src=StringIO(rules_text(cluster, node, plan.subnet, plan.monitor)),
                          dest=rules_path(node), user="root", group="root", mode="0600")
    unit = unchanged.put(name=f"Write {UNIT_PATH}", src=StringIO(unit_text(node)), dest=UNIT_PATH, user="root",
                     group="root", mode="0644")
    dropin = unchanged.put(name=f"Write {NFTABLES_DROPIN} (the table back after nftables.service flushes)",
                       src=StringIO(nftables_dropin_text(node)), dest=NFTABLES_DROPIN, user="root", group="root",
                       mode="0644", create_remote_dir=True)
    systemd.daemon_reload(name="Reload systemd (firewall unit changed)", _if=any_changed(unit, dropin))
    if plan.apply:  # the live table is not the rendered one (the plan's firewall line names the node)
        # nft -c first: a ruleset the kernel refuses stops here with nft's message, the old table intact.
        server.shell(
            name=f"Apply the nftables table {TABLE} (one transaction)",
            commands=[f"{NFT} -c -f {rules_path(node)}", f"{NFT} -f {rules_path(node)}"],
        )
    # Active, not only enabled: every unit that listens requires it (templates/after_firewall.j2), so
    # it must be up before the roles below start theirs. Its start loads the table just applied.
    unchanged.service(name=f"Enable and start {UNIT}", service=f"{UNIT}.service", running=True, enabled=True)
elif plan.remove:  # firewall_enabled is false and a table is live
    server.shell(
        name=f"Remove the nftables table {TABLE} (firewall_enabled is false)",
        commands=[f"systemctl disable {UNIT}.service 2>/dev/null || true",
                  f"rm -f {UNIT_PATH} {NFTABLES_DROPIN} {rules_path(node)}", "systemctl daemon-reload",
                  f"{NFT} delete table {TABLE}"],
    )
