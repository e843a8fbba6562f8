"""roles/image, its ship: the head's build pushed to the registry on its fabric address, and every worker's
pull by the digest the push printed started in the background (roles/image/background.py: it runs while
the weights ship and the head proves its engine); step 7d (pull_wait_tasks.py) waits for the pulls and
proves the same image ID everywhere (roles/image/tasks.py builds it; deploy.py runs the hub fetch's start
between the two).

Operations that depend on another host's (push before pull, pull before the ID check) are defined
on every host and gated with _if: pyinfra orders operations by merging each host's sequence, so
an operation defined on one host alone has no order against the other hosts' operations.
"""
from pyinfra import host, state
from pyinfra.operations import python, server

from roles.image.background import start_pull, start_step
from roles.image.checks import push_image, registry_ref
from roles.image.commands import push_command, push_step
from sparkfleet.decided import decisions
from sparkfleet.image_pin import repin_command
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

# 2. Workers start pulling what they lack, in the background, over the fabric, by the digest the head's
#    push printed (the tag is anyone's on the fabric to push); the pull tags it with the plain name and
#    pins their unit to that digest. Step 7d waits for it.
python.call(
    name=start_step(profile),
    function=start_pull,
    remote=registry_ref(cluster, profile),
    local=profile.image_ref,
    _if=lambda: not on_head and node.name in plan.ship,
)

# 2b. A worker that already holds the head's image by one of its digests (a rollback to a commit
#     every node kept) has its pin written again: nothing is pulled.
server.shell(
    name=f"Pin the worker's unit to the head's digest of {profile.image_ref} (the image is here)",
    commands=[repin_command(node, plan.repin[node.name])] if node.name in plan.repin else [],
    _if=lambda: node.name in plan.repin,
)
