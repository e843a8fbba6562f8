"""Rollback: serve the previous recipe commit again, from the images every node kept, no rebuild.

Used by rollback.py (a deploy file): before any role builds the cluster model, it reads the
served-commit history on the head and overrides serving_recipe_commit on every host for this
run only. Data still names the newer commit: a plain deploy afterwards rolls forward again, so
the printed message says to pin the previous commit in data to keep it.
"""
from pyinfra import logger
from pyinfra.api.exceptions import DeployError

from roles.image.facts import DeployedCommits
from roles.serving.schema import load_profile
from sparkfleet.once import active_hosts, once_per_run


def _override_with_previous(state) -> str:
    hosts = active_hosts(state)
    head = next((h for h in hosts if h.data.get("rank") == 0), None)
    if head is None:
        raise DeployError("rollback: the head (rank 0) is not among the hosts of this run")
    data = head.data
    profile = load_profile(data.get("serving_profile", "glm-5.3-flash-exl3"))
    data_dir = data.get("preflight_data_dir", "/var/lib/sparkfleet")
    history = head.get_fact(DeployedCommits, path=f"{data_dir}/recipes/{profile.name}.deployed")
    if len(history) < 2:
        raise DeployError(f"rollback: {head.name} has served {len(history)} recipe commit(s) of {profile.name}; nothing to roll back to")
    current, previous = history[-1], history[-2]
    for h in hosts:
        h.data.serving_recipe_commit = previous  # this run only (pyinfra override data)
    logger.info(
        f"--> sparkfleet rollback: {profile.name} recipe {current} -> {previous} (images kept, no rebuild). "
        f"To stay there, set serving_recipe_commit = \"{previous}\" in data; a plain deploy rolls forward."
    )
    return previous


def override_with_previous(state) -> str:
    return once_per_run(state, "rollback", lambda: _override_with_previous(state))
