"""roles/image, its ship: the head's build pushed to the registry on its fabric address, pulled by every
worker by the digest the push printed, pinned, and the same image ID proven everywhere (roles/image/tasks.py
builds it; deploy.py runs the hub fetch's start between the two).

Operations that depend on another host's (push before pull, pull before the ID check) are defined
on every host and gated with _if: pyinfra orders operations by merging each host's sequence, so
an operation defined on one host alone has no order against the other hosts' operations.
"""
from pyinfra import host, state
from pyinfra.operations import python, server

from roles.image.checks import pull_by_digest, push_image, registry_ref, verify_same_image
from roles.image.commands import pull_step, push_command, push_step
from sparkfleet.decided import decisions
from sparkfleet.image_pin import repin_command
from sparkfleet.model.engine import image_pin_path
from sparkfleet.model.serving import node_profile
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
plan = decisions(state).image  # the run's plan (tools/plan.py): build on the head, ship to workers
in_sync = plan.in_sync
on_head = node.is_head

# 1. The head pushes its build to the fabric registry (only the layers it lacks).
python.call(
    name=push_step(profile),
    function=push_image,
    local=profile.image_ref,
    remote=registry_ref(cluster, profile),
    push=push_command(node, profile, registry_ref(cluster, profile)),  # bounded: image_push_timeout_s
    step=push_step(profile),
    interval=node.progress_interval_s,
    _if=lambda: on_head and not in_sync,
)

# 2. Workers pull what they lack, over the fabric, by the digest the head's push printed (the tag is
#    anyone's on the fabric to push), tag it with the plain name, and pin their unit to that digest.
python.call(
    name=pull_step(profile),
    function=pull_by_digest,  # bounded: image_pull_timeout_s
    remote=registry_ref(cluster, profile),
    local=profile.image_ref,
    pin=image_pin_path(node),
    step=pull_step(profile),
    _if=lambda: not on_head and node.name in plan.ship,
)

# 2b. A worker that already holds the head's image by one of its digests (a rollback to a commit
#     every node kept) has its pin written again: nothing is pulled.
server.shell(
    name=f"Pin the worker's unit to the head's digest of {profile.image_ref} (the image is here)",
    commands=[repin_command(node, plan.repin[node.name])] if node.name in plan.repin else [],
    _if=lambda: node.name in plan.repin,
)

# 3. The same image ID everywhere: true at prepare when in sync, checked after the pulls otherwise.
python.call(
    name="Check every node has the same image ID",
    function=verify_same_image,
    ref=profile.image_ref,
    _if=lambda: on_head and not in_sync,
)
