"""The fleet's one API key behind the router (roles/router/fleet_key.py), before roles/serving's
api_key_tasks.py derives each head's files from its key file: written, root-only from the first byte,
through a shell's stdin (never files.put, whose `--diff` prints the content), into the key file of
every node the plan's key verdict names (step 1b: every routed head and the router node whose key
differs from the router group's head's). Nothing when there is no router, or every key file already
holds the fleet's key."""
from pyinfra import host, logger, state
from pyinfra.operations import python

from roles.router.fleet_key import write_fleet_key
from sparkfleet.decided import fleet_decision

key_plan = fleet_decision(state).key
path = key_plan.writes.get(host.name) if key_plan is not None else None
if path:
    logger.info(f"--> sparkfleet router: {host.name} gets the fleet's API key ({key_plan.source}'s) in {path} "
                f"(root-only); what reads it there takes it once: a head's API proxy reloads, the router restarts")
    python.call(
        name=f"Write the fleet's API key into {path} (the router presents one key to every group)",
        function=write_fleet_key,
        path=path,
    )
