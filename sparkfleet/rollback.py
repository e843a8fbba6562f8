"""Rollback: serve the commit that served last again, from the images every node kept, no rebuild.

Used by rollback.py (a deploy file): before any role builds the cluster model, it reads the head's
history of what the pair attempted and served (roles/serving/history.py) and overrides
serving_recipe_commit on every host for this run only, with the commit that served last other than
the one data names: after a failed upgrade to v2 (never served), v1; after v2 served, v1 too. Data
still names the newer commit: a plain deploy afterwards rolls forward again, so the printed message
says what to set in data to stay.
"""
from pyinfra import logger
from pyinfra.api.exceptions import DeployError

from roles.serving.history import RecipeHistory, deployed_file, history_file, rollback_message, rollback_target
from roles.serving.schema import node_profile
from sparkfleet.config import build_cluster
from sparkfleet.once import active_hosts, once_per_run


def _override_with_previous(state) -> str:
    hosts = active_hosts(state)
    head_host = next((h for h in hosts if h.data.get("rank") == 0), None)
    if head_host is None:
        raise DeployError("rollback: the head (rank 0) is not among the hosts of this run")
    # The model as data says, not cached on the state (cluster_from_state): the override below
    # must be what every role reads.
    cluster = build_cluster((h.name, h.data.dict()) for h in state.inventory)
    head = cluster.node(head_host.name)
    profile = node_profile(head)
    path = history_file(head, profile)
    events = head_host.get_fact(RecipeHistory, path=path, deployed=deployed_file(head, profile))
    choice = rollback_target(events, profile.recipe.commit, head.name, profile.name, path)
    for h in hosts:
        h.data.serving_recipe_commit = choice.target  # this run only (pyinfra override data)
    logger.info(rollback_message(choice, profile.name, profile.image))
    return choice.target


def override_with_previous(state) -> str:
    return once_per_run(state, "rollback", lambda: _override_with_previous(state))
