"""roles/fabric: the CX7 link as a netplan drop-in, applied only on change, then proven end to end."""
from io import StringIO

from pyinfra import host, state
from pyinfra.operations import files, python, server

from roles.fabric.checks import fabric_state, netplan_text, prove_jumbo_frames
from roles.fabric.schema import NETPLAN_FILE
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
fabric = fabric_state(state)  # prepare-time verdict for all nodes; proves the link if nothing changes

# 1. The drop-in, root-only: netplan warns about (and NVIDIA's guide avoids) world-readable files.
netplan_file = files.put(
    name="Write the fabric netplan drop-in",
    src=StringIO(netplan_text(node)),
    dest=NETPLAN_FILE,
    user="root",
    group="root",
    mode="0600",
)

# 2. Apply when the file changed, or when the live link drifted from it (an MTU set by hand).
live_drift = fabric.drift[host.name]
server.shell(
    name="Apply netplan (fabric file or live link changed)",
    commands=["netplan apply"],
    _if=lambda: netplan_file.did_change() or bool(live_drift),
)

# 3. After every node has applied: jumbo frames to every peer, or the deploy stops naming both ends.
if not fabric.converged:
    python.call(
        name="Prove jumbo frames to every peer",
        function=prove_jumbo_frames,
        node=node,
        peers=cluster.peers(node),
    )
