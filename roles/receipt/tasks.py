"""roles/receipt: a benchmark receipt after every deploy that (re)started the pair (roles/receipt/receipt.py).

Runs last, once the watchdog is back: the pair serves, and the load is short and fixed. A deploy that
restarted nothing takes no receipt; receipt_enabled = false skips it.
"""
from pyinfra import host, state
from pyinfra.operations import python

from roles.receipt.receipt import take_receipt
from sparkfleet.model.api_key import key_file
from sparkfleet.decided import decisions
from sparkfleet.model.serving import node_profile
from sparkfleet.model.weights import model_dir
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
pair = decisions(state).serving  # the run's plan (tools/plan.py): did this deploy restart the pair?

python.call(
    name="Take the benchmark receipt (the pair restarted)",
    function=take_receipt,
    pair=cluster.head.name,
    node=node,
    profile=profile,
    key_path=key_file(node),
    model_dir=model_dir(node, profile.model),
    nodes=tuple(n.name for n in cluster.nodes),  # the pair's: its long steps of this deploy are kept
    _if=lambda: node.is_head and node.receipt_enabled and pair.restart,
)
