"""roles/fabric: the CX7 link as a netplan drop-in, applied only on change (proven end to end by
proof_tasks.py, once the firewall admits the group's peers)."""
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.operations import python, server

from roles.fabric.checks import netplan_text
from sparkfleet.fabric_others import fabric_others
from sparkfleet.decided import decisions
from sparkfleet.model.fabric import NETPLAN_FILE, RENDERERS_SETTLED
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
fabric = decisions(state).fabric  # the run's plan (step 1b): drift per node; the link proven if nothing changes

# 1. Other configurations of the netdev: preflight stopped on them unless fabric_take_over is set
#    (and each can be taken over); then each is disabled so that neither a re-run nor a reboot
#    brings it back, and kept on disk.
others = [c for c in fabric_others(state)[host.name][1] if c.takeover]
if others and node.fabric_take_over:
    for other in others:
        logger.warning(f"{host.name}: fabric_take_over: {other.describe()}: {other.action}")
    take_over = server.shell(
        name="Take over the fabric netdev from its other configurations",
        commands=[c.takeover for c in others],
    )
else:
    take_over = None

# 2. The drop-in, root-only: netplan warns about (and NVIDIA's guide avoids) world-readable files.
netplan_file = unchanged.put(
    name="Write the fabric netplan drop-in",
    src=StringIO(netplan_text(node)),
    dest=NETPLAN_FILE,
    user="root",
    group="root",
    mode="0600",
)

# 3. Apply when the file changed, when the live link drifted from it (an MTU set by hand), or when
#    another configuration was just taken over.
live_drift = fabric.drift[host.name]
server.shell(
    name="Apply netplan (fabric file or live link changed)",
    commands=["netplan apply", RENDERERS_SETTLED],
    _if=lambda: netplan_file.did_change() or bool(live_drift) or bool(take_over and take_over.did_change()),
)
