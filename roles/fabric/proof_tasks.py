"""roles/fabric, after roles/firewall: jumbo frames from every node to every peer of its serving
group, through the firewall that admits exactly those peers on the fabric (a node moved to another
group is admitted by its new peers' firewalls first), or the deploy stops naming both ends."""
from pyinfra import host, state
from pyinfra.operations import python

from roles.fabric.checks import prove_jumbo_frames
from sparkfleet.decided import decisions
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
fabric = decisions(state).fabric  # the run's plan (step 1b): the pings passed then and nothing changed since

# After every node has applied its netplan file and its firewall.
if not fabric.converged:
    python.call(
        name="Prove jumbo frames to every peer",
        function=prove_jumbo_frames,
        node=node,
        peers=cluster.peers(node),
    )
