"""roles/image, step 7d: every worker's background pull (started at step 5, roles/image/background.py)
waited for, with its progress, then the same image ID proven on every node: before the collective
(step 7e) and the prewarm run the image on every rank.

Defined on every host and gated with _if, as ship_tasks.py's operations are: the ID check on the head
comes after every worker's wait."""
from pyinfra import host, state
from pyinfra.operations import python

from roles.image.background import await_pull
from roles.image.checks import registry_ref, verify_same_image
from roles.image.commands import pull_step
from sparkfleet.decided import decisions
from sparkfleet.inventory import cluster_from_state
from sparkfleet.model.engine import image_pin_path
from sparkfleet.model.serving import node_profile

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
plan = decisions(state).image

# 1. Each worker waits for its pull: its output on a failure, its own start and end recorded.
python.call(
    name=pull_step(profile),
    function=await_pull,
    remote=registry_ref(cluster, profile),
    pin=image_pin_path(node),
    step=pull_step(profile),
    _if=lambda: not node.is_head and node.name in plan.ship,
)

# 2. The same image ID everywhere: true at prepare when in sync, checked after the pulls otherwise.
python.call(
    name="Check every node has the same image ID",
    function=verify_same_image,
    ref=profile.image_ref,
    _if=lambda: node.is_head and not plan.in_sync,
)
