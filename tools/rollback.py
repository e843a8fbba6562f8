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
from sparkfleet.model.serving import node_profile
from sparkfleet.config import build_cluster
from sparkfleet.once import fleet_hosts, once_per_fleet


def _override_with_previous(state) -> dict[str, str]:
    """Per serving group: the commit that served last, set on the group's hosts for this run."""
    hosts = {h.name: h for h in fleet_hosts(state)}
    # The model as data says, built afresh: the override below must be what every role reads, so
    # the cached model (sparkfleet.inventory.fleet_from_state) is dropped once it is set.
    fleet = build_cluster((h.name, h.data.dict()) for h in state.inventory)
    targets = {}
    for name, group in fleet.groups.items():
        head = group.head
        head_host = hosts.get(head.name)
        if head_host is None:
            raise DeployError(f"rollback: the head (rank 0) of serving group '{name}', {head.name}, is not among the "
                              f"hosts of this run")
        profile = node_profile(head)
        path = history_file(head, profile)
        events = head_host.get_fact(RecipeHistory, path=path, deployed=deployed_file(head, profile))
        choice = rollback_target(events, profile.recipe.commit, head.name, profile.name, path)
        for n in group.nodes:
            if n.name in hosts:
                hosts[n.name].data.serving_recipe_commit = choice.target  # this run only (pyinfra override data)
        logger.info(rollback_message(choice, profile.name, profile.image))
        targets[name] = choice.target
    state._sparkfleet_cluster = None
    return targets


def override_with_previous(state) -> dict[str, str]:
    return once_per_fleet(state, "rollback", lambda: _override_with_previous(state))
