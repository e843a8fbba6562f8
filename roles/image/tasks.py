"""roles/image: the recipe's overlay image, built once on the head and shipped to every node.

This file (deploy.py step 5): the registry, the build waited for (build_start_tasks.py checked the
recipe out, checked its drift and started the build at step 2d, before the fabric), the exact drift it
allows, pruning; the ship is roles/image/ship_tasks.py (the push, the workers' pulls started in the
background, after the head's hub fetch has started) and pull_wait_tasks.py (the pulls waited for, the
same ID everywhere: step 7d).

A registry on the head's fabric address serves the head's build, so each worker pulls only the layers
it lacks over the CX7 link. Every node must end with the same image ID. Older images stay (rollback).

Operations that depend on another host's (push before pull, pull before the ID check) are defined
on every host and gated with _if: pyinfra orders operations by merging each host's sequence, so
an operation defined on one host alone has no order against the other hosts' operations.
"""
import shlex
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.facts.server import Which
from pyinfra.operations import apt, python, server, systemd
from pyinfra.operations.util import any_changed

from roles.image.background import await_build
from roles.image.checks import check_exact_drift, exact_drift_ranks, other_profile_images, recipe_bumped, recipe_dir
from roles.image.commands import build_step
from roles.image.facts import DeployedCommits, LocalImages
from sparkfleet.decided import decisions
from sparkfleet.model.docker import registry_address
from sparkfleet.model.image import REGISTRY_DROPIN, REGISTRY_ROOT, history_path
from sparkfleet.model.serving import node_profile
from sparkfleet import unchanged
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import at_once
from sparkfleet.render import render

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
recipe = profile.recipe
plan = decisions(state).image  # the run's plan (tools/plan.py): build on the head, ship to workers
head_id = plan.head_id
on_head = node.is_head
src = recipe_dir(node, profile)

# What this step reads of the node, at once: pyinfra keeps no fact between reads, and one read after
# the other each costs a round trip (bench/noop.py). The head holds the recipe's history and the
# registry; a worker reads only its images, when data prunes other profiles'.
served, registry_bin, local_images = at_once(
    lambda: host.get_fact(DeployedCommits, path=history_path(node, profile)) if on_head else [],
    lambda: host.get_fact(Which, command="docker-registry") if on_head else None,
    lambda: host.get_fact(LocalImages) if node.serving_prune_other_profiles else None,
)
bumped = recipe_bumped(served, recipe.commit)

# 3. The registry, on the head's fabric address only.
if on_head:
    if not registry_bin:
        apt.packages(name="Install the image registry", packages=["docker-registry"], update=True, cache_time=3600)
    registry_config = unchanged.put(
        name="Write the registry config (fabric address only)",
        src=StringIO(render("image", "/etc/docker/registry/config.yml", address=registry_address(cluster),
                        root=REGISTRY_ROOT)),
        dest="/etc/docker/registry/config.yml",
        mode="0644",
    )
    registry_dropin = unchanged.put(
        name=f"Write {REGISTRY_DROPIN} (retried until the fabric address binds)",
        src=StringIO(render("image", REGISTRY_DROPIN, firewall_enabled=node.firewall_enabled)),
        dest=REGISTRY_DROPIN,
        mode="0644",
        create_remote_dir=True,
    )
    systemd.daemon_reload(name="Reload systemd (registry drop-in changed)", _if=registry_dropin.did_change)
    unchanged.service(name="Enable and start the registry", service="docker-registry", running=True, enabled=True)
    systemd.service(
        name="Restart the registry (config or drop-in changed)",
        service="docker-registry",
        restarted=True,
        _if=any_changed(registry_config, registry_dropin),
    )

# 4. The build started at step 2d (build_start_tasks.py), waited for: its progress while it runs, its
#    own start and end recorded, its failure printed as the build printed it. Nothing before this
#    needs the image; everything after runs it.
python.call(
    name=build_step(profile),
    function=await_build,
    ref=profile.image_ref,
    step=build_step(profile),
    _if=lambda: on_head and head_id is None,
)

# 4b. Exact drift: the recipe's launcher at the new commit, run in the new image on the head with the
#     engine replaced by a recorder, per rank, against what sparkfleet renders; before anything ships.
exact = on_head and bumped and recipe.launcher is not None
if on_head and bumped and recipe.launcher is None:
    logger.info(f"    [{host.name}] recipe {recipe.commit[:12]}: exact drift not checked (the profile names no recipe.launcher)")
python.call(
    name="Check what the recipe's launcher starts against what sparkfleet renders",
    function=check_exact_drift,
    src=src,
    new=recipe.commit,
    image=profile.image_ref,
    launcher=recipe.launcher or "",
    launcher_args=recipe.launcher_args,
    engine=profile.engine,
    ranks=exact_drift_ranks(state, cluster) if exact else [],
    weights_dir=node.weights_dir,
    acknowledged=node.recipe_drift_acknowledged,
    _if=lambda: exact,
)

# 5. Other profiles' images stay for switching back, unless data says to prune them.
stale = (
    other_profile_images(local_images, profile, registry_address(cluster), node.serving_site)
    if node.serving_prune_other_profiles
    else []
)
server.shell(
    name="Remove other profiles' images (serving_prune_other_profiles)",
    commands=[f"docker rmi {' '.join(shlex.quote(ref) for ref in stale)}"] if stale else [],
    _if=lambda: bool(stale),
)
