"""roles/image: the recipe's overlay image, built once on the head and shipped to every node.

This file: the checkout, drift, the registry, the build (and the exact drift it allows), pruning; the
ship is roles/image/ship_tasks.py (the push, the workers' pulls started in the background, after the
head's hub fetch has started: deploy.py step 5) and pull_wait_tasks.py (the pulls waited for, the same
ID everywhere: step 7d).

The head checks the recipe out at the pinned commit and builds the image there, tagged with the
commit; a registry on the head's fabric address serves it, so each worker pulls only the layers it
lacks over the CX7 link. Every node must end with the same image ID. Older images stay (rollback).

Operations that depend on another host's (push before pull, pull before the ID check) are defined
on every host and gated with _if: pyinfra orders operations by merging each host's sequence, so
an operation defined on one host alone has no order against the other hosts' operations.
"""
import shlex
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.facts.files import File
from pyinfra.facts.server import Which
from pyinfra.operations import apt, python, server, systemd
from pyinfra.operations.util import any_changed

from roles.image.checks import (
    RECORD_BASE_STEP, base_record_path, check_exact_drift, check_recipe_drift, exact_drift_ranks, other_profile_images,
    recipe_dir, record_base_images, refuse_loose_commit,
)
from roles.image.commands import build_command, build_step, checkout_step, git_fetch_command
from roles.image.facts import DeployedCommits, LocalImages, RecipeCheckout, ResolvedCommit
from sparkfleet.decided import decisions
from sparkfleet.progress import docker_used_probe, progress_command
from sparkfleet.model.docker import registry_address
from sparkfleet.model.image import REGISTRY_DROPIN, REGISTRY_ROOT, history_path
from sparkfleet.model.engine import pinned_env
from sparkfleet.model.serving import FULL_SHA, node_profile
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

short = None if FULL_SHA.match(recipe.commit) or set(recipe.commit) == {"0"} else recipe.commit
base_record = base_record_path(node, profile)
# What this step reads of the node, at once: pyinfra keeps no fact between reads, and one read after
# the other each costs a round trip (bench/noop.py). The head holds the recipe, its history and the
# registry; a worker reads only its images, when data prunes other profiles'.
resolved, git, checkout, served, registry_bin, base_record_file, local_images = at_once(
    lambda: host.get_fact(ResolvedCommit, path=src, short=short, repository=recipe.repository) if on_head and short else None,
    lambda: host.get_fact(Which, command="git") if on_head else None,
    lambda: (host.get_fact(RecipeCheckout, path=src) if on_head else None) or {},
    lambda: host.get_fact(DeployedCommits, path=history_path(node, profile)) if on_head else [],
    lambda: host.get_fact(Which, command="docker-registry") if on_head else None,
    lambda: host.get_fact(File, path=base_record) if on_head else None,
    lambda: host.get_fact(LocalImages) if node.serving_prune_other_profiles else None,
    limit=6,  # each read holds an SSH channel; sshd's MaxSessions is 10 (sparkfleet/once.py at_once)
)

# 0. The recipe commit is a full SHA (an abbreviation is resolved on the head, to name the full one).
if on_head:
    refuse_loose_commit(node, profile, resolved)

# 1. The recipe at its pinned commit on the head (a branch can move under us; a commit cannot).
if on_head and not git:
    apt.packages(name="Install git", packages=["git"], update=True, cache_time=3600)
d, repo = shlex.quote(src), shlex.quote(recipe.repository)
server.shell(
    name=checkout_step(recipe),
    commands=[
        f"mkdir -p {d} && cd {d} && {{ [ -d .git ] || git init --quiet; }}",
        f"cd {d} && {{ git remote remove origin 2>/dev/null || true; }} && git remote add origin {repo}",
        git_fetch_command(node, recipe, src),  # bounded: image_git_fetch_timeout_s
        f"cd {d} && git -c advice.detachedHead=false checkout --quiet --force --detach {recipe.commit} && git clean -fdxq",
    ],
    _if=lambda: on_head
    and (not checkout.get("head", "").startswith(recipe.commit) or checkout.get("origin") != recipe.repository),
)

# 2. Upstream drift: every launch default that changed since the served commit, and whether we pin it.
bumped = bool(served) and not served[-1].startswith(recipe.commit)  # a recipe bump (or a rollback)
python.call(
    name="Check the recipe's launch defaults against the served commit",
    function=check_recipe_drift,
    src=d,
    old=served[-1] if served else "",
    new=recipe.commit,
    launch_files=recipe.launch_files,
    pinned=pinned_env(profile, node),
    acknowledged=node.recipe_drift_acknowledged,
    _if=lambda: on_head and bumped,
)

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

# 4. Build once on the head, tagged with the commit; push it to the registry for the workers.
#    First the Dockerfile's base images, by digest: pulled when absent (docker build then uses exactly
#    that local image) and recorded on the head beside the served-commit history.
has_base_record = on_head and base_record_file is not None
python.call(
    name=RECORD_BASE_STEP,
    function=record_base_images,
    src=src,
    commit=recipe.commit,
    dockerfile=recipe.dockerfile,
    build_args=dict(recipe.build_args),
    record=base_record,
    pull_limit_s=node.image_pull_timeout_s,
    _if=lambda: on_head and (head_id is None or not has_base_record),
)
server.shell(
    name=build_step(profile),
    # bounded: image_build_timeout_s; its progress: docker's filesystem growing (sparkfleet/progress.py)
    commands=[progress_command(build_command(node, profile, src), step=build_step(profile),
                               interval=node.progress_interval_s, probe=docker_used_probe())],
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
