"""The fleet's one API key behind the router (roles/router/fleet_key.py), before roles/serving's
api_key_tasks.py derives each head's files from its key file: written, root-only, over SFTP, into the
key file of every routed head and of the router node whose key differs from the router group's
head's. Nothing when there is no router, or every key file already holds the fleet's key."""
from io import StringIO

from pyinfra import host, logger, state

from roles.router.fleet_key import plan
from sparkfleet import unchanged

key_plan = plan(state)
path = key_plan.writes.get(host.name) if key_plan is not None else None
if path:
    logger.info(f"--> sparkfleet router: {host.name} gets the fleet's API key ({key_plan.source}'s) in {path} "
                f"(root-only); what reads it there restarts once")
    unchanged.put(
        name=f"Write the fleet's API key into {path} (the router presents one key to every group)",
        src=StringIO(key_plan.key.decode()),
        dest=path,
        user="root",
        group="root",
        mode="0600",
        create_remote_dir=True,
    )
