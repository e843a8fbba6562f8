"""roles/weights: the profile's model and drafter, fetched once on the head, fanned out over the fabric.

The head fetches from weights_source (the hub, a directory, a URL) into weights_dir and writes a
manifest (path, size, sha256). Each worker pulls from the head's rsync daemon, verifies every file
against the head's manifest and keeps that manifest. When the manifests already match, nothing
moves; an interrupted transfer resumes from its partial file.
"""
from pyinfra import host, state
from pyinfra.operations import server

from roles.serving.schema import node_profile
from roles.weights.checks import fetch_command, profile_models, pull_command, weights_plan
from sparkfleet.inventory import cluster_from_state

cluster = cluster_from_state(state)
node = cluster.node(host.name)
profile = node_profile(node)
plan = weights_plan(state)  # prepare-time: what moves, decided once for the cluster
on_head = node.is_head

for model, revision in profile_models(profile):
    # 1. Once, on the head, from the configured source (free disk checked before the first byte).
    server.shell(
        name=f"Fetch {model} at {revision} on the head ({node.weights_source})",
        commands=[fetch_command(node, profile, model, revision)] if on_head else [],
        _if=lambda model=model: on_head and model in plan.fetch,
    )
    # 2. Then to every worker over the fabric; defined on every host so it runs after the fetch.
    server.shell(
        name=f"Send {model} to the workers over the fabric",
        commands=[] if on_head else [pull_command(cluster, node, model)],
        _if=lambda model=model: not on_head and (model, node.name) in plan.pull,
    )
