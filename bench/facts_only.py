"""Baseline for bench/noop.py: a pyinfra run that gathers the facts a sparkfleet deploy gathers,
on the same hosts, and does nothing else (no operations, no checks, no table)."""

from pyinfra import host, state
from pyinfra.facts.files import Sha1File

from roles.fabric.facts import FabricLink, FabricPing
from roles.fabric.schema import NETPLAN_FILE, RENDERER_UNITS
from roles.preflight.facts import NodeFacts
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
host.get_fact(NodeFacts, data_dir=node.preflight_data_dir, netdev=node.fabric_netdev,
              renderer_unit=RENDERER_UNITS[node.netplan_renderer])
host.get_fact(FabricLink, netdev=node.fabric_netdev)
host.get_fact(Sha1File, path=NETPLAN_FILE)
for peer in cluster.peers(node):
    host.get_fact(FabricPing, peer_ip=peer.fabric_ip, payload=node.ping_payload)
