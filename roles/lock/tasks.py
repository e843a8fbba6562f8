"""0. One run at a time: the deploy lock on every node of the run, before any fact is read and so
before the first change (roles/lock/lock.py). No operation: taking it writes only the lock, and
an unchanged deploy still changes nothing. Run as a plan (`sparkfleet plan`, which changes
nothing), the lock is only read: a live holder refuses the plan, and no lock is taken."""
from pyinfra import state

from roles.lock.lock import refuse_if_held, take_deploy_locks
from sparkfleet.once import once_per_fleet
from sparkfleet.plan_command import plan_dir

if plan_dir():
    once_per_fleet(state, "deploy-lock", lambda: refuse_if_held(state))
else:
    once_per_fleet(state, "deploy-lock", lambda: take_deploy_locks(state))
