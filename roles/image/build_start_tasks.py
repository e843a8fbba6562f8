"""roles/image, its start (deploy.py step 2d): the recipe checked out at its pinned commit on the head,
its launch defaults checked against the served commit, its base images recorded by digest, and the
build started in the background (roles/image/background.py), right after Docker (step 2c) and before
the fabric: nothing from step 3 to the registry needs the image, so they run while it builds. Step 5
(roles/image/tasks.py) waits for it.

The head checks the recipe out at the pinned commit and builds the image there, tagged with the
commit. Operations are defined on every host and gated with _if (tasks.py says why).
"""
import shlex

from pyinfra import host, state
from pyinfra.facts.files import File
from pyinfra.facts.server import Which
from pyinfra.operations import apt, python, server

from roles.image.background import build_start_step, start_build
from roles.image.checks import (
    RECORD_BASE_STEP, base_record_path, check_recipe_drift, recipe_bumped, recipe_dir, record_base_images,
    refuse_loose_commit,
)
from roles.image.commands import build_command, checkout_step, git_fetch_command
from roles.image.facts import DeployedCommits, RecipeCheckout, ResolvedCommit
from sparkfleet.decided import decisions
from sparkfleet.model.image import history_path
from sparkfleet.model.engine import pinned_env
from sparkfleet.model.serving import FULL_SHA, node_profile
from sparkfleet.inventory import cluster_from_state
from sparkfleet.once import at_once

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
# the other each costs a round trip (bench/noop.py). The head holds the recipe and its history.
resolved, git, checkout, served, base_record_file = at_once(
    lambda: host.get_fact(ResolvedCommit, path=src, short=short, repository=recipe.repository) if on_head and short else None,
    lambda: host.get_fact(Which, command="git") if on_head else None,
    lambda: (host.get_fact(RecipeCheckout, path=src) if on_head else None) or {},
    lambda: host.get_fact(DeployedCommits, path=history_path(node, profile)) if on_head else [],
    lambda: host.get_fact(File, path=base_record) if on_head else None,
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
bumped = recipe_bumped(served, recipe.commit)
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

# 3. The build, once on the head, tagged with the commit; started in the background (step 5 waits).
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
python.call(
    name=build_start_step(profile),
    function=start_build,
    ref=profile.image_ref,
    build=build_command(node, profile, src),  # bounded: image_build_timeout_s; its log on the head
    _if=lambda: on_head and head_id is None,
)
