"""roles/weights: the profile's model and drafter, fetched once on the head, fanned out over the fabric.

The head fetches from weights_source (the hub, a directory, a URL) into weights_dir and writes a
manifest (path, size, sha256), in the background while the image is built and shipped
(roles/weights/background.py); the first step here waits for it. Each worker pulls from the head's
HTTP server of its weights (roles/fanout), verifies every file against the head's manifest and keeps
that manifest. When the manifests already match, nothing moves; an interrupted transfer resumes from
its partial file. The fetch and each pull are bounded (weights_fetch_timeout_s,
fanout_rsync_timeout_s; sparkfleet/bounded.py): at the limit the deploy stops naming the step, the
host and the key, and a re-run resumes.
"""
from pyinfra import host, state
from pyinfra.operations import python, server

from sparkfleet.decided import decisions
from sparkfleet.model.serving import node_profile
from sparkfleet.model.weights import model_dir
from sparkfleet.progress import dir_bytes_probe, progress_command
from roles.weights.background import await_fetch, await_pull, followed
from roles.weights.checks import fetch_step, profile_models, pull_command, pull_step
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
plan = decisions(state).weights  # the run's plan (tools/plan.py), prepare-time: what moves, decided once for the cluster
on_head = node.is_head

for model, revision in profile_models(profile):
    # 1. Once, on the head, from the configured source: the fetch started in the background at step 4b
    #    or right after the build (roles/weights/background.py), waited for here with its progress (the
    #    model's directory growing); it fails the run as the fetch failed.
    python.call(
        name=fetch_step(node, model, revision),
        function=await_fetch,
        model=model,
        revision=revision,
        _if=lambda model=model: on_head and model in plan.fetch,
    )
    # 2. Then to every worker over the fabric; defined on every host so it runs after the fetch. A worker
    #    whose pull followed the head's fetch in the background (step 4b or 5: followed) waits for it
    #    here; any other pulls now.
    follows = model in followed(decisions(state), cluster, node, [model])
    python.call(
        name=pull_step(model),
        function=await_pull,
        model=model,
        _if=lambda follows=follows: follows,
    )
    server.shell(
        name=pull_step(model),
        commands=[] if on_head or follows else [progress_command(  # progress: bytes landed in the model's directory
            pull_command(cluster, node, model), step=pull_step(model), interval=node.progress_interval_s,
            probe=dir_bytes_probe(model_dir(node, model)))],
        _if=lambda model=model, follows=follows: not on_head and not follows and (model, node.name) in plan.pull,
    )
